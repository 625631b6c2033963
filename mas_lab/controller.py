"""The training loop: Algorithm 1 of the paper, one step after another.

    problems -> tree sampling (episodes.py) -> groups (problem, agent, turn) -> GRPO advantages
    -> optional filter -> samples routed to sigma(agent) -> each Learner updates -> weight sync
    -> run store + MLflow, and an evaluation on held-out problems before, every N steps, after.
"""
from __future__ import annotations

import functools
import math
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from mas_lab import checkpoint
from mas_lab.background import Background
from mas_lab.baselines import ConstantBaseline, task_baseline
from mas_lab.algo import build_groups, build_trajectory_groups, filter_groups, group_stats, grpo_advantages
from mas_lab.backend import PolicyBackend
from mas_lab.config import TaskConfig
from mas_lab.control import RunControl
from mas_lab.diagnostics import diagnostics
from mas_lab.envs import ENVS, ProblemPool
from mas_lab.episodes import Episode, Generate, Timing, call_seed, tree_rollout, with_system
from mas_lab.learner.samples import Sample
from mas_lab.progress import Progress, ProgressEvent
from mas_lab.store import RunStore
from mas_lab.tracking import Tracker


@dataclass
class TrainStep:
    """What one training step produced."""

    step: int
    episodes: list[Episode]
    metrics: dict[str, float]


def compute_advantages(episodes: list[Episode], k: int, eps: float, tree: bool = True):
    """Build the groups of a step, check their invariants, and set each candidate's advantage.

    tree (at_grpo): groups (problem, agent, turn) of K candidates from one observation (Sec. 4.1).
    Otherwise (mas_grpo, single_agent): groups (problem) of K independent trajectories."""
    if tree:
        groups = build_groups([c for e in episodes for t in e.turns for c in t.candidates], k)
    else:
        trajectories = [(e.problem.id, [c for t in e.turns for c in t.candidates]) for e in episodes]
        groups = build_trajectory_groups(trajectories, k)
    for group in groups:
        group.set_advantages(grpo_advantages(group.rewards, eps))
    return groups


def wilson_interval(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a success rate."""
    if n == 0:
        return (0.0, 0.0)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def verdict(before: dict | None, after: dict | None, constant: dict | None = None) -> str:
    """The before/after comparison of held-out success in plain words (95% Wilson intervals), and,
    when the environment has one, how "after" compares with the best constant answer (baselines.py):
    a lift that does not clear it may be one learned answer, not solving the task."""
    if before is None or after is None:
        return "no evaluation after training to compare with" if before else "no evaluation"
    (b_low, b_high), (a_low, a_high) = before["ci"], after["ci"]
    change = f"held-out success {before['success']:.3f} [{b_low:.2f}, {b_high:.2f}] -> {after['success']:.3f} [{a_low:.2f}, {a_high:.2f}]"
    if a_low > b_high:
        out = change + ": better after training (the 95% intervals do not overlap)"
    elif a_high < b_low:
        out = change + ": worse after training (the 95% intervals do not overlap)"
    else:
        out = change + ": no clear change (the 95% intervals overlap)"
    if constant is None:
        return out
    c_low, c_high = constant["ci"]
    fixed = f"the best constant answer ({constant['answer']!r}, the same reply to every problem) solves {constant['success']:.3f} [{c_low:.2f}, {c_high:.2f}]"
    if a_low > c_high:
        return out + f"; above the best constant answer: {fixed}"
    if a_low > b_high:
        return out + f"; but not clearly above what a fixed answer scores: {fixed}, so the team may have learned one answer rather than to solve the task"
    return out + f"; for comparison, {fixed}"


def reward_metrics(episodes: list[Episode], prefix: str = "") -> dict[str, float]:
    """Mean reward per role and per (role, turn), final team reward and success rate."""
    out: dict[str, float] = {}
    by_role: dict[str, list[float]] = {}
    by_role_turn: dict[str, list[float]] = {}
    for episode in episodes:
        for turn in episode.turns:
            rewards = [c.reward for c in turn.candidates]
            by_role.setdefault(turn.role, []).extend(rewards)
            by_role_turn.setdefault(f"{turn.role}/t{turn.turn}", []).extend(rewards)
    for key, values in {**by_role, **by_role_turn}.items():
        out[f"{prefix}reward/{key}"] = statistics.fmean(values)
    everything = [r for values in by_role.values() for r in values]
    out[f"{prefix}reward/mean"] = statistics.fmean(everything) if everything else 0.0
    finals = [e.turns[-1].candidates[e.turns[-1].chosen].team for e in episodes if e.turns]
    out[f"{prefix}team_reward"] = statistics.fmean(finals) if finals else 0.0
    out[f"{prefix}success_rate"] = statistics.fmean(float(e.success) for e in episodes) if episodes else 0.0
    out[f"{prefix}turns"] = statistics.fmean(len({t.turn for t in e.turns}) for e in episodes) if episodes else 0.0
    return out


class Controller:
    def __init__(self, task: TaskConfig, backend: PolicyBackend, store: RunStore, tracker: Tracker | None = None,
                 run_dir: Path | None = None):
        self.task = task
        # The mode, decided once: tree sampling (K candidates per (turn, agent), groups per
        # (problem, agent, turn)) or K independent trajectories per problem (trajectory groups).
        self.tree = task.algorithm.mode == "at_grpo"
        self.backend = backend
        self.store = store
        self.tracker = tracker
        self.run_dir = run_dir  # None: no checkpoints (unit tests)
        self.control = RunControl(store)
        self.pool = ProblemPool(ENVS[task.env.name], task.env.params, task.train.seed, task.train.eval_problems)
        self.generate: Generate = backend.generate
        self.step = 0  # the last finished step
        self.cursor = 0  # index of the next training problem
        self.last_checkpoint: int | None = None
        self._pending: tuple[Background, int] | None = None  # a checkpoint being sealed in the background
        self.paused = False
        self.stop_requested = False

    def next_problems(self) -> list:
        """E distinct problems for one step (a repeated problem would merge two groups)."""
        chosen, seen = [], set()
        while len(chosen) < self.task.train.problems_per_step:
            problem = self.pool.train(self.cursor)
            self.cursor += 1
            if problem.id not in seen:
                seen.add(problem.id)
                chosen.append(problem)
        return chosen

    def train_step(self, step: int, progress: Progress | None = None) -> TrainStep:
        """Algorithm 1, one step: sample, group, advantages, filter, update, sync, record."""
        task, algo = self.task, self.task.algorithm
        tell = progress or (lambda event: None)
        started_wall = time.time()
        started = time.perf_counter()
        problems = self.next_problems()
        timing = Timing()
        seed = call_seed(task.train.seed, "step", step)
        if self.tree:  # one live episode per problem; K candidates per (turn, agent), the best continues
            episodes = [Episode(i, p, self.pool.make(p)) for i, p in enumerate(problems)]
        else:  # K independent trajectories per problem, one candidate per (turn, agent)
            episodes = [Episode(i * algo.k + j, p, self.pool.make(p)) for i, p in enumerate(problems) for j in range(algo.k)]
        tree_rollout(task, episodes, self.generate, algo.k if self.tree else 1, seed, timing=timing,
                     on_turn=lambda t, role: tell(ProgressEvent(f"rollout t{t} {role}", step)))

        groups = compute_advantages(episodes, algo.k, algo.std_eps, self.tree)
        kept, report = filter_groups(groups, algo.filter)
        kept_keys = {g.key for g in kept}
        samples: dict[str, list[Sample]] = {name: [] for name in task.policies}
        for group in kept:
            for c in group.members:  # routed only to the policy of the candidate's role
                samples[c.policy].append(Sample(c.prompt_ids, c.response_ids, c.advantage, c.temperature,
                                                tuple(c.logprobs)))

        tell(ProgressEvent("learner", step))
        learner_started = time.perf_counter()
        updates = self.backend.update(samples)
        learner_s = time.perf_counter() - learner_started
        tell(ProgressEvent("weight sync", step))
        sync_s = self.backend.sync_weights(step)

        stats = [group_stats(group, kept=group.key in kept_keys) for group in groups]
        metrics = reward_metrics(episodes)
        metrics["groups"] = len(groups)
        metrics["zero_std_frac"] = statistics.fmean(float(g.zero_std) for g in stats) if stats else 0.0
        metrics.update(diagnostics(groups, kept))
        metrics["filtered_groups"] = report.dropped_groups
        metrics["filtered_samples"] = report.dropped_samples
        for name, update in updates.items():
            for key in ("loss", "nll", "clip_frac", "grad_norm", "samples", "tokens", "mismatch_abs", "mismatch_kl",
                        "ratio_mean", "ratio_min", "ratio_max", "kl_initial", "tis_weight_mean", "tis_capped_frac"):
                if key in update:
                    metrics[f"{key}/{name}"] = update[key]
        total = time.perf_counter() - started
        metrics["time/rollout"] = timing.generate_s
        metrics["time/reward"] = timing.reward_s
        metrics["time/learner"] = learner_s
        metrics["time/weight_sync"] = sync_s
        metrics["time/other"] = max(0.0, total - timing.generate_s - timing.reward_s - learner_s - sync_s)
        metrics["time/step"] = total
        metrics["tokens_generated"] = timing.generated_tokens
        metrics["tokens_per_s"] = timing.generated_tokens / timing.generate_s if timing.generate_s else 0.0

        self.store.write_step(step, started_wall, episodes, "train", stats, metrics)
        return TrainStep(step, episodes, metrics)

    def warm_up(self) -> None:
        """The format warm-up (`train.warmup_steps`), before the first evaluation: each step takes
        the next problems_per_step training problems and, for every role, a reply in its answer
        format with random content (`Env.format_demo`: never read from the problem), and trains
        each policy on its roles' replies with advantage 1 (on-policy, so the clipped objective's
        gradient is the log-likelihood's: one supervised step). It teaches a small model the form
        of an answer so that GRPO has legal, differing candidates to compare; what it cannot teach
        is which moves solve a problem. The evaluation at step 0 comes after it, so a run's lift is
        the RL's alone. Logged as an event per step with each policy's mean -log p of the replies
        before that step's update."""
        from transformers import AutoTokenizer

        from mas_lab.models import resolve
        from mas_lab.rollout.engine import encode_chat

        task = self.task
        by_model = {model: AutoTokenizer.from_pretrained(resolve(model)) for model in {p.model for p in task.policies.values()}}
        tokenizers = {name: by_model[policy.model] for name, policy in task.policies.items()}
        rng = random.Random(call_seed(task.train.seed, "warmup"))
        roles = [r.name for r in task.roles]
        for i in range(task.train.warmup_steps):
            samples: dict[str, list[Sample]] = {name: [] for name in task.policies}
            for problem in self.next_problems():
                env = self.pool.make(problem)
                for role in roles:
                    policy = task.policy_of(role)
                    tokenizer = tokenizers[policy]
                    reply = env.format_demo(role, rng)
                    response = tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.eos_token_id]
                    messages = with_system(env.messages(role, 0), task.role(role).system_prompt)
                    samples[policy].append(Sample(encode_chat(tokenizer, messages), response, 1.0, demonstration=True))
            updates = self.backend.update(samples)
            self.store.event(0, "warmup", f"format warm-up step {i + 1}/{task.train.warmup_steps}: "
                             + ", ".join(f"nll/{n} {u['nll']:.3f}" for n, u in updates.items()))
        self.backend.sync_weights(0)

    def evaluate(self, step: int, samples: int = 1) -> dict[str, float]:
        """Episodes on the fixed held-out problems, one trajectory each (K = 1): greedy when
        `samples` is 1, else `samples` sampled trajectories per problem at the roles' settings.
        Success rate with a 95% Wilson interval, mean turns, mean reward per role."""
        problems = self.pool.eval_set
        if not problems:
            return {}
        started_wall, started = time.time(), time.perf_counter()
        episodes = [Episode(i * samples + j, p, self.pool.make(p)) for i, p in enumerate(problems) for j in range(samples)]
        tree_rollout(self.task, episodes, self.generate, 1, call_seed(self.task.train.seed, "eval"), greedy=samples == 1)
        metrics = reward_metrics(episodes, prefix="eval/")
        low, high = wilson_interval(sum(e.success for e in episodes), len(episodes))
        metrics["eval/success_ci_low"], metrics["eval/success_ci_high"] = low, high
        # how many different first answers the team gave: 1 means one reply to every problem
        env_cls = ENVS[self.task.env.name]
        answerers = {env_cls.answer_role, env_cls.single_role}
        metrics["eval/distinct_answers"] = float(len({t.candidates[t.chosen].response for e in episodes
                                                      for t in e.turns if t.turn == 0 and t.role in answerers}))
        constant = self.constant
        if constant is not None:
            metrics["eval/constant_success"] = constant.success
            metrics["eval/constant_ci_low"], metrics["eval/constant_ci_high"] = wilson_interval(constant.solved, constant.problems)
        metrics["eval/time"] = time.perf_counter() - started
        self.store.write_step(step, started_wall, episodes, "eval", metrics=metrics)
        self.store.event(step, "eval", f"success {metrics['eval/success_rate']:.3f} on {len(episodes)} episodes"
                         + (f"; best constant answer {constant.answer!r} {constant.success:.3f}" if constant else ""))
        return metrics

    @functools.cached_property
    def constant(self) -> ConstantBaseline | None:
        """The best fixed answer on the held-out problems (baselines.py), or None; computed once."""
        return task_baseline(self.task, self.pool.eval_set) if self.pool.eval_set else None

    # --- the run: steps, safe points, checkpoints -------------------------------------------------
    def run(self, progress: Progress | None = None) -> dict[str, float]:
        """Evaluate, then train until `train.steps` (evaluating every `eval_every` and at the end),
        checking for pause/stop at every step boundary and checkpointing every `checkpoint.every`."""
        train, every = self.task.train, self.task.checkpoint.every

        def tell(event: ProgressEvent) -> None:
            self.control.publish(step=event.step, phase=event.phase, paused=self.paused,
                                 last_checkpoint=self.last_checkpoint)
            if progress:
                progress(event)

        if self.step == 0 and not self.store.metrics(0):
            if train.warmup_steps:
                tell(ProgressEvent("format warm-up", 0))
                self.warm_up()
            tell(ProgressEvent("eval", 0))
            self.evaluate(0)
            self.checkpoint(0)
        while self.step < train.steps and self.safe_point(tell):
            step = self.step + 1
            result = self.train_step(step, tell)
            self.step = step
            tell(ProgressEvent("done", step, result.metrics))
            if step == train.steps or (train.eval_every and step % train.eval_every == 0):
                tell(ProgressEvent("eval", step))
                self.evaluate(step)
            if step == train.steps or (every and step % every == 0):
                self.checkpoint(step)
        if self.step >= train.steps:
            self.checkpoint(self.step, wait=True)  # no-op when that step is already checkpointed
        tell(ProgressEvent("finished" if self.step >= train.steps else "stopped", self.step))
        return self.summary()

    def summary(self) -> dict:
        """Held-out success before training and after it, with 95% intervals, and what they say.
        "After" is the evaluation at the final step only: a run stopped early has none (None)."""
        metrics = self.store.metrics()
        evals = sorted(s for s, m in metrics.items() if "eval/success_rate" in m)

        def at(step: int | None) -> dict | None:
            if step is None:
                return None
            m = metrics[step]
            return {"step": step, "success": m["eval/success_rate"],
                    "ci": [m.get("eval/success_ci_low"), m.get("eval/success_ci_high")]}

        before = at(evals[0] if evals else None)
        after = at(evals[-1] if evals and evals[-1] == self.step and self.step > evals[0] else None)
        best = self.constant if evals else None
        constant = None if best is None else {"answer": best.answer, "success": best.success,
                                              "ci": list(wilson_interval(best.solved, best.problems))}
        return {"eval_before": before["success"] if before else None, "eval_after": after["success"] if after else None,
                "before": before, "after": after, "constant": constant, "verdict": verdict(before, after, constant),
                "steps": self.step, "stopped": self.step < self.task.train.steps}

    def request_stop(self) -> None:
        """From a signal handler: stop at the next safe point, with a checkpoint."""
        self.stop_requested = True

    def _serve_requests(self) -> None:
        for command in self.control.take():
            if command == "pause" and not self.paused:
                self.paused = True
                self.store.event(self.step, "pause", f"paused after step {self.step}")
                if self.tracker:
                    self.tracker.set_tag("paused", "true")
            elif command == "resume" and self.paused:
                self.paused = False
                self.store.event(self.step, "resume", f"resumed after step {self.step}")
                if self.tracker:
                    self.tracker.set_tag("paused", "false")
            elif command == "stop":
                self.stop_requested = True

    def safe_point(self, tell) -> bool:
        """A step boundary: serve pause/resume/stop. Returns False when the run must stop."""
        self._collect_checkpoint(wait=False)
        self._serve_requests()
        if self.paused and not self.stop_requested:
            self.checkpoint(self.step, wait=True)
            tell(ProgressEvent("paused", self.step))
            last_ping = 0.0
            while self.paused and not self.stop_requested:
                time.sleep(0.2)
                self._serve_requests()
                if time.monotonic() - last_ping > 5.0:
                    last_ping = time.monotonic()
                    self.control.publish(actors_alive=self.backend.alive())
                tell(ProgressEvent("paused", self.step))
        if self.stop_requested:
            self.checkpoint(self.step, wait=True)
            self.store.event(self.step, "stop", f"stopped after step {self.step}")
            return False
        return True

    def checkpoint(self, step: int, wait: bool = False) -> None:
        """Write a checkpoint of the state after `step`, then feed MLflow up to `step`.

        With `checkpoint.background`, the learners copy their policies now and write them while
        the next step runs; the checkpoint is sealed (manifest, rename) when they are on disk and
        counts from then on (a crash before that resumes from the one before). `wait`: return only
        when it is complete (pause, stop, the end of the run)."""
        if self.run_dir is None or self.last_checkpoint == step:
            return
        if self._pending is not None and self._pending[1] == step:
            self._collect_checkpoint(wait=True)
            return
        self._collect_checkpoint(wait=True)  # one checkpoint in flight at a time
        state = {"step": step, "cursor": self.cursor, "mlflow_run_id": self.tracker.run_id if self.tracker else None,
                 "task": self.task.model_dump(mode="json"), "store": self.store.digest(step)}
        keep_last = self.task.checkpoint.keep_last
        if not self.task.checkpoint.background:
            path, seconds = checkpoint.save(self.run_dir, step, state, self.backend.save_policies, keep_last)
            self._checkpointed(step, path, seconds)
            return
        pending = checkpoint.begin(self.run_dir, step, state)
        self.backend.save_policies(pending.tmp / "policies", background=True)

        def seal() -> tuple[Path, float]:
            self.backend.wait_saves()
            return checkpoint.finish(pending, keep_last)

        self._pending = (Background(seal, name=f"checkpoint-{step}"), step)
        if wait:
            self._collect_checkpoint(wait=True)

    def _collect_checkpoint(self, wait: bool) -> None:
        """Record a background checkpoint that is complete (or wait for it); raise its error on
        the run's thread."""
        if self._pending is None:
            return
        sealing, step = self._pending
        if not wait and not sealing.done():
            return
        self._pending = None
        self._checkpointed(step, *sealing.result())

    def _checkpointed(self, step: int, path: Path, seconds: float) -> None:
        self.last_checkpoint = step
        self.store.event(step, "checkpoint", f"{path.name} written in {seconds:.2f}s")
        self.control.publish(last_checkpoint=step)
        if self.tracker:
            self.tracker.sync_from_store(self.store, step)

    def restore(self, path: Path) -> dict:
        """Continue from a verified checkpoint: weights, optimizers, RNGs, cursor, step."""
        state = checkpoint.verify(path)
        self.backend.load_policies(path / "policies", state["step"])
        checkpoint.restore_driver_rng(path)
        self.step, self.cursor, self.last_checkpoint = state["step"], state["cursor"], state["step"]
        return state
