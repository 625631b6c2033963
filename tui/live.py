"""The live screen: run header, charts over steps, the event log, pause and resume."""

from __future__ import annotations

from typing import cast

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Button, Footer, Header, Label, RichLog, Static
from textual_plotext import PlotextPlot

from mas_lab.analysis.plots import axis_groups, baseline_name
from mas_lab.training.metric_names import EVAL_PREFIX
from tui.data import SPLIT, LiveSnapshot, event_line, fmt_duration, live_snapshot, now
from tui.navigation import Lab


class SnapshotReady(Message):
    """A fresh read of the store. Only the newest matters, so a queued one is replaced."""

    def __init__(self, snapshot: LiveSnapshot) -> None:
        super().__init__()
        self.snapshot = snapshot

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, SnapshotReady)


def _fmt(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 1e4 else f"{value:.2e}"


class Chart(Vertical):
    """One panel of `mas-lab plot` as a terminal line chart: training step on the x-axis, a line
    per metric key (eval success only at the steps it was evaluated), and below it each key's
    last value with the smallest and largest seen."""

    def __init__(self, panel: str, title: str, series: dict[str, list[tuple[int, float]]]) -> None:
        super().__init__(classes="chart-box", id=f"chart-{panel}")
        self.panel, self.title, self.series = panel, title, series

    @property
    def keys(self) -> list[str]:
        return list(self.series)

    def legend(self) -> str:
        parts = []
        for key, points in self.series.items():
            if key.endswith(("_ci_low", "_ci_high")):  # drawn as the interval's ends, named by its point
                continue
            values = [v for _, v in points]
            if values:
                # the last value and the range seen (min-max: not an interval)
                parts.append(f"{key} {_fmt(values[-1])} (min {_fmt(min(values))}, max {_fmt(max(values))})")
        return "   ".join(parts)

    def compose(self) -> ComposeResult:
        yield PlotextPlot(classes="chart")
        yield Static(self.legend(), classes="legend")

    def on_mount(self) -> None:
        self.draw()

    def show(self, series: dict[str, list[tuple[int, float]]]) -> None:
        if series != self.series:
            self.series = series
            self.draw()

    def draw(self) -> None:
        plot = self.query_one(PlotextPlot)
        plt = plot.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(self.title)
        plt.xlabel("step")
        for key, points in self.series.items():
            if not points:
                continue
            steps, values = [s for s, _ in points], [v for _, v in points]
            label = key if len(self.series) > 1 else None
            if key.endswith(("_ci_low", "_ci_high")):  # the 95% interval's ends at each evaluation
                plt.scatter(steps, values, marker="-", color="gray")
            elif baseline_name(key) is not None:  # a baseline without a model: a line, not points
                plt.plot(
                    steps, values, marker="dot", color="gray" if key.endswith("constant_success") else None, label=label
                )
            elif key.startswith(EVAL_PREFIX):  # the team's evaluations: points at their steps, never joined
                plt.scatter(steps, values, marker="o", label=label)
            else:
                plt.plot(steps, values, marker="dot" if len(points) < 3 else "braille", label=label)
        plot.refresh()
        self.query_one(".legend", Static).update(self.legend())


class LiveScreen(Screen):
    BINDINGS = [
        Binding("p", "toggle_pause", "Pause/Resume"),
        Binding("g", "app.switch_mode('groups')", "Groups"),
        Binding("r", "app.switch_mode('replay')", "Replay"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.snapshot: LiveSnapshot | None = None
        self.events_after = 0.0
        self.requested: str | None = None  # a pause/resume sent but not yet taken

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("loading ...", id="run-header")
        yield Static("", id="pending")
        with Horizontal(id="live-body"):
            yield VerticalScroll(id="charts")
            with Vertical(id="side"):
                yield Button("Pause", id="pause", variant="warning")
                yield Static("", id="split")
                yield Label("events")
                # min_width: RichLog renders every line at least 78 wide (its default), which the pane then cuts
                yield RichLog(id="events", markup=False, wrap=True, max_lines=2000, min_width=20)
        yield Footer()

    def on_mount(self) -> None:
        self.refresh_data()
        self.set_interval(1.0, self.refresh_data)

    @work(thread=True, exclusive=True, group="live")
    def refresh_data(self) -> None:
        snapshot = live_snapshot(cast(Lab, self.app).run_dir, self.events_after)
        self.post_message(SnapshotReady(snapshot))

    def on_snapshot_ready(self, message: SnapshotReady) -> None:
        snap = self.snapshot = message.snapshot
        state = snap.state
        step = state.get("step") or 0
        paused = bool(state.get("paused"))
        status = "PAUSED" if paused else ("RUNNING" if state.get("running") else str(state.get("status", "")).upper())
        remaining = snap.left_s
        end = now() if state.get("running") else snap.finished
        elapsed = end - snap.started if snap.started and end else None
        header = (
            f"task {snap.task.get('name', '?')}   step {step}/{snap.total_steps}   {status}   phase {state.get('phase', '-')}\n"
            f"elapsed {fmt_duration(elapsed)}   eta {fmt_duration(remaining) if state.get('running') else '-'}   "
            f"last checkpoint {state.get('last_checkpoint')}"
        )
        if state.get("error") or status in ("FAILED", "CRASHED"):
            reason = state.get("error") or "its process died without recording why; see run.log in the run folder"
            header += f"\n{status.lower()}: {reason}"
        self.query_one("#run-header", Static).update(header)
        if self.requested == "pause" and paused or self.requested == "resume" and not paused:
            self.requested = None
        pending = state.get("pending") or []
        self.query_one("#pending", Static).update(
            f"{self.requested or pending[-1]} requested: waits for the step boundary (step {step + 1} in flight)"
            if (self.requested or pending) and state.get("running")
            else ""
        )
        button = self.query_one("#pause", Button)
        button.label = "Resume" if paused else "Pause"
        button.display = bool(state.get("running"))  # a finished run has nothing to pause
        self.refresh_bindings()
        self._charts(snap)
        if snap.last:
            self.query_one("#split", Static).update(
                "last step (s): "
                + "  ".join(f"{k} {snap.last.get(f'time/{k}', 0):.2f}" for k in SPLIT)
                + f"\ntokens/s {snap.last.get('tokens_per_s', 0):.0f}"
            )
        log = self.query_one("#events", RichLog)
        if not log.size.width:  # not laid out yet: lines written now would be wrapped at a guessed width
            return
        for event in snap.events:
            line = event_line(event)
            if line is not None:
                log.write(line)
            self.events_after = max(self.events_after, event["ts"])

    def _charts(self, snap: LiveSnapshot) -> None:
        box = self.query_one("#charts", VerticalScroll)
        existing = {chart.panel: chart for chart in box.query(Chart)}
        for name, (title, series) in snap.panels.items():
            # an axis per quantity, as `mas-lab plot` draws them: grad norm 0-6.6 beside a loss of ~0.08
            # on one axis flattened the loss; the success panels keep their interval ends beside the points
            groups = {"": series} if name in ("success", "hard") else axis_groups(series)
            for quantity, members in groups.items():
                panel = f"{name}-{quantity}" if quantity else name
                shown = f"{title}: {quantity}" if quantity and len(groups) > 1 else title
                if panel in existing:
                    existing[panel].show(members)
                else:
                    box.mount(Chart(panel, shown, members))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Pause and resume only while the run is live: hidden from the footer otherwise."""
        if action == "toggle_pause":
            return bool(self.snapshot and self.snapshot.state.get("running"))
        return True

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "pause":
            self.action_toggle_pause()

    def action_toggle_pause(self) -> None:
        state = self.snapshot.state if self.snapshot else {}
        if not state.get("running"):
            self.notify("the run is not running", severity="warning")
            return
        wants_pause = not (state.get("paused") or self.requested == "pause")
        command = "pause" if wants_pause else "resume"
        getattr(cast(Lab, self.app).control, command)()
        self.requested = command
        self.query_one("#pending", Static).update(f"{command} requested: waits for the step boundary")
        self.notify(f"{command} requested")
