"""Stepping through a run's stored steps, one piece for the groups and replay screens: `[` and `]`
move one step, `f` pins the step shown or follows the newest one while the run is live."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, cast

from textual.binding import Binding

from mas_lab.records.control import RunControl
from mas_lab.records.store import RunStore


class Lab(Protocol):
    """What a screen reads of the app (tui/app.py's MasLabApp): the run store and the control API,
    the only sources a screen reads (a Protocol, so the screens never import the app that shows them)."""

    run_dir: Path
    store: RunStore
    control: RunControl


STEP = Binding.Group("step", compact=True)
STEP_BINDINGS = [
    Binding("left_square_bracket", "step(-1)", "Prev step", group=STEP, key_display="["),
    Binding("right_square_bracket", "step(1)", "Next step", group=STEP, key_display="]"),
]
FOLLOW_BINDING = Binding("f", "toggle_follow", "Follow/pin", show=False)


class StepNavigation:
    """Mixed into a Screen: `steps` (the stored steps it walks), `step_index`, `follow`. The screen
    says which steps it walks (`fetch_steps`) and how to show one (`show_step`, which clamps)."""

    steps: list[int]
    step_index: int
    follow: bool

    def init_steps(self) -> None:
        self.steps, self.step_index = [], 0
        self.follow = True  # while the run is live, jump to each new step (f pins the one shown)

    @property
    def lab(self) -> Lab:
        """The app, typed: its run store and control API (the only sources a screen reads)."""
        return cast(Lab, self.app)  # type: ignore[attr-defined]  # a Screen has .app

    @property
    def step(self) -> int | None:
        return self.steps[self.step_index] if self.steps else None

    def fetch_steps(self) -> list[int]:
        raise NotImplementedError

    def show_step(self, index: int) -> None:
        raise NotImplementedError

    def follow_live(self) -> None:
        """While the run is live and not pinned, show the newest step as it lands."""
        if not self.follow or not self.lab.control.status()["running"]:
            return
        steps = self.fetch_steps()
        if steps != self.steps:
            self.steps = steps
            self.show_step(len(steps) - 1)

    def action_toggle_follow(self) -> None:
        self.follow = not self.follow
        self.notify("following the newest step" if self.follow else f"pinned to step {self.step}")  # type: ignore[attr-defined]

    def action_step(self, delta: int) -> None:
        if self.steps:
            self.show_step(self.step_index + delta)
