"""The study screen: every cell of a study (task, regime, seed) with its status, step, last held-out
success, time left and node, refreshed every 2 s from the cells' folders (mas_lab.study.driver.study_status);
enter opens a cell's run in the dashboard, c compares the selected task's runs (mas_lab.analysis.compare:
the pooled table and the settings that differ, the PNGs written beside)."""

from __future__ import annotations

from pathlib import Path

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import DataTable, Footer, Header, Markdown, Static

from mas_lab.analysis.compare import compare
from mas_lab.study.driver import STATUS_COLUMNS, cell_run_folder, status_cells, status_line, study_status
from mas_lab.study.families import Family


class StudyCompareScreen(ModalScreen):
    """compare.md of one task's runs, and where its PNGs are."""

    BINDINGS = [Binding("escape", "dismiss", "Close")]

    def __init__(self, markdown: str, where: Path) -> None:
        super().__init__()
        self.markdown, self.where = markdown, where

    def compose(self) -> ComposeResult:
        with Vertical(id="study-compare"):
            yield Static(f"charts: {self.where}", id="study-compare-where", markup=False)
            with VerticalScroll():
                yield Markdown(self.markdown)


class StudyApp(App):
    """Exits with the run folder to open (enter) or None (q)."""

    CSS_PATH = "app.tcss"
    TITLE = "mas-lab study"
    BINDINGS = [
        Binding("enter", "open_run", "Open run"),
        Binding("c", "compare", "Compare task"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(self, families: list[Family], refresh_s: float = 2.0) -> None:
        super().__init__()
        self.families, self.refresh_s = families, refresh_s
        self.rows: list[dict] = []
        self.sub_title = families[0].study_file or families[0].study

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="study-counts", markup=False)
        table: DataTable = DataTable(id="cells", zebra_stripes=True, cursor_type="row")
        table.add_columns(*STATUS_COLUMNS)
        yield table
        yield Footer()

    def on_mount(self) -> None:
        self.refresh_cells()
        self.set_interval(self.refresh_s, self.refresh_cells)

    def refresh_cells(self) -> None:
        self.rows = study_status(self.families)
        table = self.query_one("#cells", DataTable)
        cursor = table.cursor_row
        table.clear()
        for row in self.rows:
            table.add_row(*status_cells(row))
        if self.rows:
            table.move_cursor(row=min(cursor, len(self.rows) - 1))
        self.query_one("#study-counts", Static).update(f"{len(self.rows)} cells: {status_line(self.rows)}")

    def selected(self) -> dict | None:
        table = self.query_one("#cells", DataTable)
        return self.rows[table.cursor_row] if self.rows and 0 <= table.cursor_row < len(self.rows) else None

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_open_run()  # the table takes enter itself: its selection opens the run

    def action_open_run(self) -> None:
        row = self.selected()
        folder = cell_run_folder(row) if row else None
        if folder is None:
            self.notify("this cell has no run yet", severity="warning")
            return
        self.exit(folder)

    def action_compare(self) -> None:
        row = self.selected()
        if row is None:
            return

        family = next(f for f in self.families if f.key == row["task"])
        cells = [r for r in self.rows if r["task"] == row["task"]]
        labels = {folder: r["regime"] for r in cells if (folder := cell_run_folder(r)) is not None}
        if not labels:
            self.notify("no run of this task yet", severity="warning")
            return
        out = Path(family.out) / "compare"
        self.notify(f"comparing {len(labels)} runs of {family.key} ...")

        def work() -> None:  # loading stores and drawing take seconds: off the UI thread
            try:
                path = compare(list(labels), out, labels)
            except (OSError, ValueError) as exc:
                self.call_from_thread(self.notify, f"compare failed: {exc}", severity="error")
                return
            self.call_from_thread(self.push_screen, StudyCompareScreen(path.read_text(), out))

        self.run_worker(work, thread=True, exclusive=True, group="compare")
