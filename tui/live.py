"""The live screen: run header, charts over steps, the event log, pause and resume."""
from __future__ import annotations

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Button, Footer, Header, Label, RichLog, Sparkline, Static

from tui.data import SPLIT, LiveSnapshot, fmt_duration, live_snapshot, now


class SnapshotReady(Message):
    """A fresh read of the store. Only the newest matters, so a queued one is replaced."""

    def __init__(self, snapshot: LiveSnapshot) -> None:
        super().__init__()
        self.snapshot = snapshot

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, SnapshotReady)


class Chart(Vertical):
    """A titled sparkline over steps with the latest value."""

    def __init__(self, key: str, title: str, values: list[float]) -> None:
        super().__init__(classes="chart")
        self.key, self.title, self.values = key, title, values

    def _label(self) -> str:
        last = f"{self.values[-1]:.3f}" if self.values else "-"
        return f"{self.title}: {last}  ({len(self.values)} points)"

    def compose(self) -> ComposeResult:
        yield Label(self._label(), classes="chart-title")
        yield Sparkline(self.values or [0.0], summary_function=max)

    def show(self, values: list[float]) -> None:
        self.values = values
        self.query_one(Label).update(self._label())
        self.query_one(Sparkline).data = values or [0.0]


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
                yield RichLog(id="events", markup=False, wrap=True, max_lines=2000)
        yield Footer()

    def on_mount(self) -> None:
        self.refresh_data()
        self.set_interval(1.0, self.refresh_data)

    @work(thread=True, exclusive=True, group="live")
    def refresh_data(self) -> None:
        snapshot = live_snapshot(self.app.run_dir, self.events_after)
        self.post_message(SnapshotReady(snapshot))

    def on_snapshot_ready(self, message: SnapshotReady) -> None:
        snap = self.snapshot = message.snapshot
        state = snap.state
        step = state.get("step") or 0
        paused = bool(state.get("paused"))
        status = "PAUSED" if paused else ("RUNNING" if state.get("running") else str(state.get("status", "")).upper())
        remaining = (snap.total_steps - step) * snap.mean_step_s if snap.mean_step_s else None
        end = now() if state.get("running") else snap.finished
        elapsed = end - snap.started if snap.started and end else None
        header = (
            f"task {snap.task.get('name', '?')}   step {step}/{snap.total_steps}   phase {state.get('phase', '-')}   "
            f"{status}   elapsed {fmt_duration(elapsed)}   eta {fmt_duration(remaining) if state.get('running') else '-'}   "
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
            if (self.requested or pending) and state.get("running") else ""
        )
        button = self.query_one("#pause", Button)
        button.label = "Resume" if paused else "Pause"
        button.disabled = not state.get("running")
        self._charts(snap)
        if snap.last:
            self.query_one("#split", Static).update(
                "last step (s): " + "  ".join(f"{k} {snap.last.get(f'time/{k}', 0):.2f}" for k in SPLIT)
                + f"\ntokens/s {snap.last.get('tokens_per_s', 0):.0f}"
            )
        log = self.query_one("#events", RichLog)
        for event in snap.events:
            log.write(f"step {event['step']:>4}  {event['kind']:<10} {event['message']}")
            self.events_after = max(self.events_after, event["ts"])

    def _charts(self, snap: LiveSnapshot) -> None:
        box = self.query_one("#charts", VerticalScroll)
        existing = {chart.key: chart for chart in box.query(Chart)}
        for key in sorted(snap.series):
            if key in existing:
                existing[key].show(snap.series[key])
            else:
                box.mount(Chart(key, key, snap.series[key]))

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
        getattr(self.app.control, command)()
        self.requested = command
        self.query_one("#pending", Static).update(f"{command} requested: waits for the step boundary")
        self.notify(f"{command} requested")
