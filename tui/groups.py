"""The groups screen: one step's groups (sortable, filterable by agent and turn), the aggregate
per (agent, turn) over all steps, and a group's candidates on selection."""

from __future__ import annotations

import dataclasses

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Footer, Header, Label, Static

from mas_lab.algo.groups import GroupStats
from tui.navigation import FOLLOW_BINDING, STEP_BINDINGS, StepNavigation

COLUMNS = tuple(f.name for f in dataclasses.fields(GroupStats))  # the statistics of a group, in order
SORTS = ("problem_id", "reward_mean", "reward_std", "zero_std", "role", "turn")


def cell(value) -> str:
    if isinstance(value, bool):
        return str(int(value))
    return f"{value:.3f}" if isinstance(value, float) else str(value)


class CandidatesScreen(ModalScreen):
    """The candidates of one group: responses, rewards, advantages; the chosen one marked."""

    BINDINGS = [Binding("escape", "dismiss", "Close")]

    def __init__(self, title: str, candidates: list[dict]) -> None:
        super().__init__()
        self.title_text, self.candidates = title, candidates

    def compose(self) -> ComposeResult:
        with Vertical(id="candidates-box"):
            yield Label(self.title_text, id="candidates-title")
            table: DataTable = DataTable(id="candidates", zebra_stripes=True)
            table.add_columns(
                "ep", "turn", "role", "idx", "chosen", "reward", "team", "local", "advantage", "tokens", "response"
            )
            for c in self.candidates:
                table.add_row(
                    c["episode"],
                    c["turn"],
                    c["role"],
                    c["idx"],
                    "*" if c["chosen"] else "",
                    cell(c["reward"]),
                    cell(c["team"]),
                    cell(c["local"]),
                    f"{c['advantage']:+.3f}",
                    c["response_tokens"],
                    (c["response"] or "").replace("\n", " ")[:80],
                )
            yield table
            yield Footer()


class GroupsScreen(StepNavigation, Screen):
    BINDINGS = [
        *STEP_BINDINGS,
        Binding("a", "cycle_agent", "Agent filter"),
        Binding("t", "cycle_turn", "Turn filter"),
        Binding("s", "cycle_sort", "Sort"),
        FOLLOW_BINDING,
        Binding("v", "app.switch_mode('live')", "Live"),
        Binding("r", "app.switch_mode('replay')", "Replay"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.init_steps()
        self.agent: str | None = None
        self.turn: int | None = None
        self.sort = "problem_id"
        self.shown: list[GroupStats] = []

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="groups-title")
        yield DataTable(id="groups", zebra_stripes=True, cursor_type="row")
        yield Label("per (agent, turn) over all steps")
        yield DataTable(id="aggregate", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#groups", DataTable)
        for name in COLUMNS:
            table.add_column(name, key=name)
        aggregate = self.query_one("#aggregate", DataTable)
        aggregate.add_columns("agent", "turn", "groups", "reward mean", "reward std", "zero-std share", "steps")
        self.on_screen_resume()
        self.set_interval(2.0, self.follow_live)

    def fetch_steps(self) -> list[int]:
        return self.lab.store.episode_steps()

    def show_step(self, index: int) -> None:
        self.step_index = max(0, min(len(self.steps) - 1, index))
        self.load()

    def on_screen_resume(self) -> None:
        self.steps = self.lab.store.episode_steps()
        self.step_index = min(self.step_index, max(0, len(self.steps) - 1))
        self.load()
        aggregate = self.query_one("#aggregate", DataTable)
        aggregate.clear()
        for row in self.lab.store.group_aggregate():
            aggregate.add_row(
                row["role"],
                row["turn"],
                row["groups"],
                cell(row["reward_mean"]),
                cell(row["reward_std"]),
                cell(row["zero_std_frac"]),
                f"{row['first_step']}-{row['last_step']}",
            )

    def load(self) -> None:
        rows = self.lab.store.groups(self.step) if self.step is not None else []
        self.agents = sorted({r.role for r in rows})
        self.turns = sorted({r.turn for r in rows})
        rows = [
            r
            for r in rows
            if (self.agent is None or r.role == self.agent) and (self.turn is None or r.turn == self.turn)
        ]
        reverse = self.sort in ("reward_mean", "reward_std", "zero_std")
        self.shown = sorted(rows, key=lambda r: (getattr(r, self.sort), r.problem_id, r.turn), reverse=reverse)
        table = self.query_one("#groups", DataTable)
        table.clear()
        for r in self.shown:
            table.add_row(*(cell(getattr(r, c)) for c in COLUMNS))
        self.query_one("#groups-title", Static).update(
            f"groups of step {self.step} ({self.step_index + 1}/{len(self.steps)})   agent: {self.agent or 'all'}   "
            f"turn: {'all' if self.turn is None else self.turn}   sort: {self.sort}   {len(self.shown)} groups"
        )

    def _cycle(self, current, options):
        choices = [None, *options]
        return choices[(choices.index(current) + 1) % len(choices)] if current in choices else None

    def action_cycle_agent(self) -> None:
        self.agent = self._cycle(self.agent, self.agents)
        self.load()

    def action_cycle_turn(self) -> None:
        self.turn = self._cycle(self.turn, self.turns)
        self.load()

    def action_cycle_sort(self) -> None:
        self.sort = SORTS[(SORTS.index(self.sort) + 1) % len(SORTS)]
        self.load()

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        key = str(event.column_key.value)
        if key in COLUMNS and key != "n":
            self.sort = key
            self.load()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id != "groups" or not self.shown or self.step is None:
            return
        group = self.shown[event.cursor_row]
        candidates = self.lab.store.group_candidates(self.step, group.problem_id, group.role, group.turn)
        title = f"step {self.step}  problem {group.problem_id}  agent {group.role}  turn {group.turn}"
        self.app.push_screen(CandidatesScreen(title, candidates))
