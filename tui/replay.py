"""The replay screen: a stored episode turn by turn and agent by agent, with every candidate.

Only the episode on screen is loaded, so a store of any size opens at once."""

from __future__ import annotations

import json
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, Header, Input, Label, OptionList, Static

from mas_lab.records.episode_text import candidate_headline, count
from tui.navigation import FOLLOW_BINDING, STEP_BINDINGS, StepNavigation


def candidate_text(c: dict, label: str = "", kind: str = "train") -> Text:
    head = f"{'* ' if c['chosen'] else '  '}{label}candidate {c['idx']}  {candidate_headline(c, kind)}"
    text = Text.assemble((head + "\n", "bold green" if c["chosen"] else "bold"), (c["response"] or "(empty)") + "\n")
    if c["info"]:
        text.append(f"-> {c['info']}\n", style="dim")
    return text


class SearchScreen(ModalScreen[str]):
    BINDINGS = [Binding("escape", "dismiss('')", "Cancel")]

    def compose(self) -> ComposeResult:
        with Vertical(id="search-box"):
            yield Label("search observations and responses:")
            yield Input(placeholder="text", id="search")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)


class CompareScreen(ModalScreen):
    """The best and the worst candidate of one group, side by side."""

    BINDINGS = [Binding("escape", "dismiss", "Close"), Binding("c", "dismiss", "Close")]

    def __init__(self, best: dict, worst: dict) -> None:
        super().__init__()
        self.best, self.worst = best, worst

    def compose(self) -> ComposeResult:
        with Horizontal(id="compare"):
            yield VerticalScroll(Static(candidate_text(self.best, "best: "), id="best"))
            yield VerticalScroll(Static(candidate_text(self.worst, "worst: "), id="worst"))


EPISODE, TURN, AGENT = (Binding.Group(name, compact=True) for name in ("episode", "turn", "agent"))


class ReplayScreen(StepNavigation, Screen):
    # the footer shows the grouped walk keys and the mode switches (it fits 100 columns); `?` lists all
    BINDINGS = [
        *STEP_BINDINGS,
        Binding("comma", "episode(-1)", "Prev episode", group=EPISODE, key_display=","),
        Binding("full_stop", "episode(1)", "Next episode", group=EPISODE, key_display="."),
        Binding("k", "turn(-1)", "Prev turn", group=TURN),
        Binding("j", "turn(1)", "Next turn", group=TURN),
        Binding("h", "agent(-1)", "Prev agent", group=AGENT),
        Binding("l", "agent(1)", "Next agent", group=AGENT),
        Binding("n", "next_zero_std", "Next zero-std", show=False),
        Binding("slash", "search", "Search", show=False),
        Binding("c", "compare", "Compare", show=False),
        Binding("e", "toggle_kind", "Train/eval"),
        FOLLOW_BINDING,
        Binding("g", "app.switch_mode('groups')", "Groups", show=False),
        Binding("v", "app.switch_mode('live')", "Live"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.init_steps()
        self.episodes: list[int] = []
        self.episode_index = 0
        self.episode: Any = None  # the store's record of the episode shown (a dict), or None
        self.pos = 0  # index into the episode's (turn, agent) rows
        self.kind = "train"  # or "eval": the held-out episodes

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="where")
        with Horizontal(id="replay-body"):
            yield OptionList(id="turns")
            with VerticalScroll(id="main"):
                yield Static("", id="observation")
                yield Static("", id="candidates")
                yield Static("", id="state")
        yield Footer()

    def on_mount(self) -> None:
        at = getattr(self.app, "replay_at", {})
        self.kind = at.get("kind") or self.kind
        self.steps = self.lab.store.episode_steps(self.kind)
        step = at.get("step")
        self.load_step(self.steps.index(step) if step in self.steps else 0)
        if at.get("episode") in self.episodes:
            self.load_episode(self.episodes.index(at["episode"]))
        self.set_interval(2.0, self.follow_live)

    def on_screen_resume(self) -> None:
        steps = self.lab.store.episode_steps(self.kind)
        if steps != self.steps:
            self.steps = steps
            if self.episode is None:
                self.load_step(0)

    def fetch_steps(self) -> list[int]:
        return self.lab.store.episode_steps(self.kind)

    def show_step(self, index: int) -> None:
        self.load_step(index)

    def action_toggle_kind(self) -> None:
        self.kind = "eval" if self.kind == "train" else "train"
        self.steps = self.lab.store.episode_steps(self.kind)
        self.load_step(0)
        self.notify(f"{self.kind} episodes")

    # --- loading ---------------------------------------------------------------------------------
    def load_step(self, index: int, episode: int = 0, pos: int = 0) -> None:
        if not self.steps:
            self.query_one("#where", Static).update(f"no {self.kind} steps in this run yet")
            return
        self.step_index = max(0, min(len(self.steps) - 1, index))
        self.episodes = self.lab.store.episode_indices(self.steps[self.step_index], self.kind)
        self.load_episode(min(episode, max(0, len(self.episodes) - 1)), pos)

    def load_episode(self, index: int, pos: int = 0) -> None:
        self.episode_index = index
        step = self.steps[self.step_index]
        self.episode = self.lab.store.episode(step, self.episodes[index], self.kind) if self.episodes else None
        turns = self.query_one("#turns", OptionList)
        turns.clear_options()
        if self.episode:
            turns.add_options([f"t{t['turn']} {t['role']}" for t in self.episode["turns"]])
        self.show(pos)

    def show(self, pos: int) -> None:
        rows = self.episode["turns"] if self.episode else []
        if not rows:
            return
        self.pos = max(0, min(len(rows) - 1, pos))
        row = rows[self.pos]
        problem = json.loads(self.episode["problem"])
        self.query_one("#where", Static).update(
            f"{'eval ' if self.kind == 'eval' else ''}step {self.step} ({self.step_index + 1}/{len(self.steps)})   "
            f"episode {self.episode['idx']} "
            f"({self.episode_index + 1}/{len(self.episodes)}, problem {self.episode['problem_id']})   turn {row['turn']}   "
            f"agent {row['role']} (policy {row['policy']})   success {bool(self.episode['success'])}"
        )
        self.query_one("#turns", OptionList).highlighted = self.pos
        # Text.assemble: a styled heading, then plain text (Text + Text would carry the heading's
        # style over the whole body)
        self.query_one("#observation", Static).update(
            Text.assemble(
                (f"observation of {row['role']} at turn {row['turn']}:\n", "bold underline"), row["observation"]
            )
        )
        text = Text.assemble((count(len(row["candidates"]), "candidate") + "\n", "bold underline"))
        for c in row["candidates"]:
            text.append_text(candidate_text(c, kind=self.kind))
        self.query_one("#candidates", Static).update(text)
        self.query_one("#state", Static).update(
            Text.assemble(
                ("state after the chosen action:\n", "bold underline"), row["state_after"] or json.dumps(problem)
            )
        )

    @property
    def current(self) -> dict | None:
        return self.episode["turns"][self.pos] if self.episode and self.episode["turns"] else None

    # --- navigation ----------------------------------------------------------------------------------
    def action_step(self, delta: int) -> None:
        self.load_step(self.step_index + delta, self.episode_index)

    def action_episode(self, delta: int) -> None:
        if self.episodes:
            self.load_episode(max(0, min(len(self.episodes) - 1, self.episode_index + delta)))

    def action_turn(self, delta: int) -> None:
        row = self.current
        if row is None:
            return
        rows = self.episode["turns"]
        target = row["turn"] + delta
        same_role = [i for i, r in enumerate(rows) if r["turn"] == target and r["role"] == row["role"]]
        any_role = [i for i, r in enumerate(rows) if r["turn"] == target]
        if same_role or any_role:
            self.show((same_role or any_role)[0])

    def action_agent(self, delta: int) -> None:
        row = self.current
        rows = self.episode["turns"] if self.episode else []
        target = self.pos + delta
        if row is not None and 0 <= target < len(rows) and rows[target]["turn"] == row["turn"]:
            self.show(target)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        # selected (enter or click), not highlighted: rebuilding the list highlights row 0 later
        if event.option_index != self.pos:
            self.show(event.option_index)

    def jump_to_turn(self, turn_id: int) -> None:
        found = self.lab.store.turn_location(turn_id)
        if found is None:
            return
        step, episode = found
        if self.kind != "train":  # search and zero-std jumps land on training episodes
            self.kind, self.steps = "train", self.lab.store.episode_steps()
        self.load_step(self.steps.index(step), self.lab.store.episode_indices(step).index(episode))
        self.show(next(i for i, r in enumerate(self.episode["turns"]) if r["id"] == turn_id))

    def action_next_zero_std(self) -> None:
        """The next (turn, agent) after this one, in this or a later episode, whose K rewards are equal."""
        found = self.lab.store.next_zero_std_turn(self.current["id"] if self.current else 0)
        if found is not None:
            self.jump_to_turn(found)
        else:
            self.notify("no zero-std group after this one")

    def action_search(self) -> None:
        def done(text: str | None) -> None:
            if not text:
                return
            hits = self.lab.store.search(text)
            after = self.current["id"] if self.current else 0
            later = [h for h in hits if h["turn_id"] > after] or hits
            if later:
                self.jump_to_turn(later[0]["turn_id"])
                self.notify(f"'{text}': {len(hits)} turns match")
            else:
                self.notify(f"'{text}' not found", severity="warning")

        self.app.push_screen(SearchScreen(), done)

    def action_compare(self) -> None:
        row = self.current
        if row is None or not row["candidates"]:
            return
        ranked = sorted(row["candidates"], key=lambda c: (c["reward"], -c["idx"]))
        self.app.push_screen(CompareScreen(ranked[-1], ranked[0]))
