"""The mas-lab dashboard: live, groups and replay screens over one run's store."""
from __future__ import annotations

from pathlib import Path

from textual.app import App, SystemCommand
from textual.binding import Binding

from mas_lab.control import RunControl
from mas_lab.store import RunStore
from tui.groups import GroupsScreen
from tui.live import LiveScreen
from tui.replay import ReplayScreen


class MasLabApp(App):
    CSS_PATH = "app.tcss"
    TITLE = "mas-lab"
    MODES = {"live": LiveScreen, "groups": GroupsScreen, "replay": ReplayScreen}
    BINDINGS = [Binding("q", "quit", "Quit")]

    def __init__(self, run_dir: Path, start_mode: str = "replay") -> None:
        super().__init__()
        self.run_dir = Path(run_dir)
        self.store = RunStore(self.run_dir / "run.db", create=False)
        self.control = RunControl(self.store)
        self.start_mode = start_mode
        self.sub_title = self.run_dir.name

    def on_mount(self) -> None:
        self.switch_mode(self.start_mode)

    def get_system_commands(self, screen):
        yield from super().get_system_commands(screen)
        yield SystemCommand("Live", "Run header, charts and events", lambda: self.switch_mode("live"))
        yield SystemCommand("Groups", "Group statistics per step and per (agent, turn)", lambda: self.switch_mode("groups"))
        yield SystemCommand("Replay", "Step through stored episodes turn by turn", lambda: self.switch_mode("replay"))
        yield SystemCommand("Pause run", "Pause at the next step boundary", self.control.pause)
        yield SystemCommand("Resume run", "Resume a paused run", self.control.resume)


def mode_for(run_dir: Path) -> str:
    """Live while the run's process is alive, replay once it has finished."""
    return "live" if RunControl(RunStore(run_dir / "run.db", create=False)).status()["running"] else "replay"
