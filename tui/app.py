"""The mas-lab dashboard: live, groups and replay screens over one run's store."""

from __future__ import annotations

from pathlib import Path

from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Static

from mas_lab.records.control import RunControl
from mas_lab.records.store import RunStore
from tui.groups import GroupsScreen
from tui.live import LiveScreen
from tui.replay import ReplayScreen


class HelpScreen(ModalScreen):
    """Every key of the screen it was opened on, and the app's (the footer shows only some)."""

    BINDINGS = [Binding("escape", "dismiss", "Close"), Binding("question_mark", "dismiss", "Close")]

    def __init__(self, over: Screen) -> None:
        super().__init__()
        self.over = over

    def compose(self) -> ComposeResult:
        keys = [*getattr(self.over, "BINDINGS", []), *MasLabApp.BINDINGS]
        lines = [f"{type(self.over).__name__.removesuffix('Screen').lower()} screen: keys", ""]
        lines += [f"  {b.key_display or b.key:<22} {b.description}" for b in keys if isinstance(b, Binding)]
        lines += [
            "",
            "  pagedown / pageup      scroll the focused pane (the live screen's charts: the panels of mas-lab plot)",
            "  tab / shift+tab        move the focus between panes",
            "  ctrl+p                 command palette",
            "  escape or ?            close this help",
        ]
        with VerticalScroll(id="help-box"):
            yield Static("\n".join(lines), id="help", markup=False)


class MasLabApp(App):
    CSS_PATH = "app.tcss"
    TITLE = "mas-lab"
    MODES = {"live": LiveScreen, "groups": GroupsScreen, "replay": ReplayScreen}
    BINDINGS = [Binding("q", "quit", "Quit"), Binding("question_mark", "help", "Keys", key_display="?")]

    def __init__(self, run_dir: Path, start_mode: str = "replay", replay_at: dict | None = None) -> None:
        """`replay_at`: where the replay screen opens, {"kind", "step", "episode"} (replay --step ...)."""
        super().__init__()
        self.replay_at = replay_at or {}
        self.run_dir = Path(run_dir)
        self.store = RunStore(self.run_dir / "run.db", create=False)
        self.control = RunControl(self.store)
        self.start_mode = start_mode
        self.sub_title = self.run_dir.name

    def on_mount(self) -> None:
        self.switch_mode(self.start_mode)

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self.screen))

    def get_system_commands(self, screen):
        yield from super().get_system_commands(screen)
        yield SystemCommand("Live", "Run header, charts and events", lambda: self.switch_mode("live"))
        yield SystemCommand(
            "Groups", "Group statistics per step and per (agent, turn)", lambda: self.switch_mode("groups")
        )
        yield SystemCommand("Replay", "Step through stored episodes turn by turn", lambda: self.switch_mode("replay"))
        state = self.control.status()
        if state["running"]:  # a finished or crashed run has nothing to pause or resume
            if state.get("paused"):
                yield SystemCommand("Resume run", "Resume the paused run", self.control.resume)
            else:
                yield SystemCommand("Pause run", "Pause at the next step boundary", self.control.pause)
