"""The training loop: Algorithm 1 of the paper, one step after another.

problems -> tree sampling (episodes.py) -> groups (problem, agent, turn) -> GRPO advantages
-> optional filter -> samples routed to sigma(agent) -> each Learner updates -> weight sync
-> run store + MLflow, and an evaluation on held-out problems before, every N steps, after.
"""

from __future__ import annotations

import fcntl
import pickle
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from mas_lab.actors.backend import PolicyBackend
from mas_lab.algo import Group, filter_groups, group_stats
from mas_lab.algo.credit import Credit, assign_advantages
from mas_lab.analysis.evidence import HeldOut
from mas_lab.analysis.reporting import reward_metrics
from mas_lab.config import TaskConfig
from mas_lab.envs import ENVS, Problem, ProblemPool
from mas_lab.learner.samples import Sample
from mas_lab.records import checkpoint
from mas_lab.records.background import Background
from mas_lab.records.control import RunControl
from mas_lab.records.store import RunStore
from mas_lab.records.tracking import Tracker
from mas_lab.sandbox import isolation as sandbox
from mas_lab.training.baselines import ConstantBaseline, task_pool
from mas_lab.training.curriculum import promotion
from mas_lab.training.diagnostics import diagnostics
from mas_lab.training.episodes import Episode, Generate, Timing, call_seed, tree_rollout
from mas_lab.training.evaluation import Evaluator
from mas_lab.training.metric_names import LEARNER_METRICS, STEP_TIME, TIME_KEYS
from mas_lab.training.progress import Progress, ProgressEvent
from mas_lab.training.warmup import format_warm_up, warmup_fingerprint

PREFETCHED = "prefetched_rollout.pkl"  # in a checkpoint taken with the next step's rollout already made


@dataclass
class Rollout:
    """One step's sampled episodes (Algorithm 1's inner loops) and what sampling them cost: made in
    the step itself, or under `algorithm.overlap` while the learners updated on the step before."""

    step: int
    episodes: list[Episode]
    timing: Timing


@dataclass
class TrainStep:
    """What one training step produced."""

    step: int
    episodes: list[Episode]
    metrics: dict[str, float]


def compute_advantages(episodes: list[Episode], method: str, credit: Credit) -> list[Group]:
    """Build the groups of a step, check their invariants, and set each candidate's advantage by
    `method` (algo/credit.py). Tree (algorithm.mode tree): groups (problem, agent, turn) of K candidates from one
    observation (Sec. 4.1); otherwise (trajectories, single_agent): groups (problem) of K independent
    trajectories."""
    trajectories = [(e.problem.id, [c for t in e.turns for c in t.candidates]) for e in episodes]
    return assign_advantages(trajectories, method, credit, outcomes=[e.final_team for e in episodes])


def staleness(episodes: list[Episode], step: int) -> dict[str, float]:
    """Per policy: how many updates the weights that sampled this step's candidates are behind the
    weights this step trains (the learner holds version step - 1 before its update; the workers
    report the version they sampled with): 0 on-policy, 1 under `algorithm.overlap`. Policies whose
    engine reports no version are left out."""
    oldest: dict[str, int] = {}
    for episode in episodes:
        for turn in episode.turns:
            for c in turn.candidates:
                if c.version is not None:
                    oldest[c.policy] = min(oldest.get(c.policy, c.version), c.version)
    return {f"staleness/{policy}": float(step - 1 - version) for policy, version in oldest.items()}


class Trainer:
    def __init__(
        self,
        task: TaskConfig,
        backend: PolicyBackend,
        store: RunStore,
        tracker: Tracker | None = None,
        run_dir: Path | None = None,
    ):
        self.task = task
        # The mode, decided once: tree sampling (K candidates per (turn, agent), groups per
        # (problem, agent, turn)) or K independent trajectories per problem (trajectory groups).
        self.tree = task.algorithm.mode == "tree"
        self.credit = Credit.of(task.algorithm, task.roles)  # the credit settings, each role's K, read once
        self.backend = backend
        self.store = store
        self.tracker = tracker
        self.run_dir = run_dir  # None: no checkpoints (unit tests)
        self.control = RunControl(store)
        self.pool = task_pool(task)
        sandbox.configure(allow_fallback=task.resources.sandbox_fallback)
        self.generate: Generate = backend.generate
        # evaluation samples through self.generate as it is at the call (a test may replace it)
        self.evaluator = Evaluator(task, self.pool, store, lambda *args: self.generate(*args))
        self.step = 0  # the last finished step
        self.cursor = 0  # index of the next training problem (of the current stage)
        self.stage = 0 if task.train.curriculum else len(task.train.curriculum)  # the curriculum stage in force
        self.stage_started = 0  # the last step before the stage began
        self._stage_pools: dict[int, ProblemPool] = {len(task.train.curriculum): self.pool}
        self.last_checkpoint: int | None = None
        self._pending: tuple[Background, int] | None = None  # a checkpoint being sealed in the background
        self.paused = False
        self.stop_requested = False
        self.prefetched: Rollout | None = None  # algorithm.overlap: the next step's rollout, already made

    @property
    def train_pool(self) -> ProblemPool:
        """The training problems of the stage in force (the task's own when there is no curriculum)."""
        if self.stage not in self._stage_pools:
            self._stage_pools[self.stage] = ProblemPool(
                ENVS[self.task.env.name], self.task.stage_params(self.stage), self.task.train.seed, 0
            )
        return self._stage_pools[self.stage]

    def next_problems(self) -> list[Problem]:
        """E distinct problems for one step (a repeated problem would merge two groups)."""
        chosen, self.cursor = self.train_pool.distinct_train(self.cursor, self.task.train.problems_per_step)
        return chosen

    def promote(self, step: int) -> None:
        """Move to the next curriculum stage when its rule says so (training/curriculum.py)."""
        said = promotion(self.task.train.curriculum, self.store.metrics(), self.stage, self.stage_started, step)
        if said is not None:
            self.stage, self.stage_started, self.cursor = self.stage + 1, step, 0
            self.store.event(step, "curriculum", said)

    def rollout(self, step: int, problems: list[Problem], on_turn=None) -> Rollout:
        """ALGORITHM 1: sample. Tree: K candidates per (turn, agent) from one observation, each scored on
        its own copy of the state, the best becomes the live state. Trajectories: K independent episodes.
        Seeded by the step alone, so it is the same whichever thread runs it."""
        algo = self.task.algorithm
        timing = Timing()
        if self.tree:  # one live episode per problem; K candidates per (turn, agent), the best continues
            episodes = [Episode(i, p, self.train_pool.make(p)) for i, p in enumerate(problems)]
        else:  # K independent trajectories per problem, one candidate per (turn, agent)
            episodes = [
                Episode(i * algo.k + j, p, self.train_pool.make(p))
                for i, p in enumerate(problems)
                for j in range(algo.k)
            ]
        seed = call_seed(self.task.train.seed, "step", step)
        tree_rollout(
            self.task, episodes, self.generate, algo.k if self.tree else 1, seed, timing=timing, on_turn=on_turn
        )
        return Rollout(step, episodes, timing)

    def train_step(self, step: int, progress: Progress | None = None) -> TrainStep:
        """Algorithm 1, one step: sample, group, advantages, filter, update, sync, record. Under
        `algorithm.overlap` the step's rollout was made during the step before, and the next step's
        runs during this step's update (one step off the policy: paper Algorithm 1 with the
        rollout of step n+1 sampled by the weights before update n)."""
        task, algo = self.task, self.task.algorithm
        tell = progress or (lambda event: None)
        started_wall = time.time()
        started = time.perf_counter()
        if self.prefetched is not None and self.prefetched.step == step:
            made, self.prefetched = self.prefetched, None
        else:
            made = self.rollout(
                step, self.next_problems(), lambda t, role: tell(ProgressEvent(f"rollout t{t} {role}", step))
            )
        episodes, timing = made.episodes, made.timing

        sandbox.raise_refusal()
        # ---- ALGORITHM 1: group (problem, agent, turn) and advantages (Eq. 3, or the task's credit method)
        groups = compute_advantages(episodes, algo.advantage, self.credit)
        # ---- ALGORITHM 1: filter, and route each sample to its role's policy sigma(agent)
        kept, report = filter_groups(groups, algo.filter, algo.tie_tolerance)
        kept_keys = {g.key for g in kept}
        samples: dict[str, list[Sample]] = {name: [] for name in task.policies}
        weights = {role.name: role.loss_weight for role in task.roles}
        for group in kept:
            for c in group.members:  # routed only to the policy of the candidate's role
                advantage = c.advantage * weights.get(c.role, 1.0)  # the role's weight in its policy's loss
                samples[c.policy].append(
                    Sample(c.prompt_ids, c.response_ids, advantage, c.temperature, tuple(c.logprobs), role=c.role)
                )
        skipped = [name for name, batch in samples.items() if 0 < len(batch) < algo.min_samples]
        for name in skipped:  # too few samples for a step of the usual size: no update this step
            self.store.event(
                step, "skip", f"{name}: {len(samples[name])} samples < algorithm.min_samples {algo.min_samples}"
            )
            samples[name] = []

        # ---- ALGORITHM 1: update every policy on its samples, then sync the rollout workers' weights
        tell(ProgressEvent("learner", step))
        upcoming = None
        if algo.overlap:  # the next step's rollout, with the weights before this update (drawn here, in order)
            problems = self.next_problems()
            upcoming = Background(lambda: self.rollout(step + 1, problems), name=f"rollout-{step + 1}")
        learner_started = time.perf_counter()
        updates = self.backend.update(samples)
        learner_s = time.perf_counter() - learner_started
        waited = time.perf_counter()
        if upcoming is not None:  # the engine keeps the old weights until its rollout is done
            self.prefetched = upcoming.result()
        wait_s = time.perf_counter() - waited
        tell(ProgressEvent("weight sync", step))
        sync_s = self.backend.sync_weights(step)

        # ---- RECORD: the step's group statistics and metrics, in one store transaction
        stats = [group_stats(group, kept=group.key in kept_keys, tol=algo.tie_tolerance) for group in groups]
        metrics = reward_metrics(episodes)
        metrics["groups"] = len(groups)
        metrics["zero_std_frac"] = statistics.fmean(float(g.zero_std) for g in stats) if stats else 0.0
        metrics.update(diagnostics(groups, kept))
        metrics["filtered_groups"] = report.dropped_groups
        metrics["filtered_samples"] = report.dropped_samples
        metrics["skipped_updates"] = float(len(skipped))
        for name, update in updates.items():
            for key in LEARNER_METRICS:
                if key in update:
                    metrics[f"{key}/{name}"] = update[key]
            metrics.update({k: v for k, v in update.items() if k.startswith("grad_norm_role/")})
        total = time.perf_counter() - started
        split = (timing.generate_s, timing.reward_s, learner_s, sync_s)
        metrics.update(zip(TIME_KEYS, (*split, max(0.0, total - sum(split)))))
        metrics[STEP_TIME] = total
        if algo.overlap:  # after the update, how long the next step's rollout still ran
            metrics["time/overlap_wait"] = wait_s
        metrics.update(staleness(episodes, step))
        metrics["tokens_generated"] = timing.generated_tokens
        metrics["tokens_per_s"] = timing.generated_tokens / timing.generate_s if timing.generate_s else 0.0
        metrics.update(timing.utilisation())
        if task.train.curriculum:
            metrics["curriculum/stage"] = float(self.stage)

        self.store.write_step(step, started_wall, episodes, "train", stats, metrics)
        return TrainStep(step, episodes, metrics)

    def warm_up(self) -> None:
        """The format warm-up before the first evaluation (training/warmup.py); with
        `train.warmup_cache`, taken from a run that had the same warm-up inputs (the entry named by
        warmup_fingerprint), or trained and left there for the next: the policies and their
        optimizers, the problems' cursor and the driver's RNG as the warm-up left them, saved and
        loaded as a checkpoint is, so a run that takes it continues as if it had warmed up itself."""
        cache = self.task.train.warmup_cache
        if cache is None:
            format_warm_up(self.task, self.backend, self.store, self.next_problems, self.train_pool.make)
            return
        entry = Path(cache) / warmup_fingerprint(self.task)
        entry.mkdir(parents=True, exist_ok=True)
        with open(entry / "lock", "a") as lock:  # one run trains an entry; one started beside it waits, then loads it
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self.store.event(0, "warmup", f"waiting for the run that is training the warm-up in {entry}")
                fcntl.flock(lock, fcntl.LOCK_EX)
            self._warm_up_shared(entry)

    def _warm_up_shared(self, entry: Path) -> None:
        """warm_up's work on a cache entry, under its lock: load it, or train it and leave it."""
        for found in reversed(checkpoint.complete(entry)):
            try:
                state = checkpoint.verify(found)
            except checkpoint.CheckpointError as exc:  # a damaged entry: train the warm-up again
                self.store.event(0, "warmup", f"shared warm-up {found} not used: {exc}")
                continue
            self._load(found, state)
            for message in state["events"]:
                self.store.event(0, "warmup", message)
            self.store.event(0, "warmup", f"format warm-up taken from {entry} (the same warm-up inputs and code)")
            return
        format_warm_up(self.task, self.backend, self.store, self.next_problems, self.train_pool.make)
        state = {
            "step": 0,
            **self._position(),
            "task": self.task.model_dump(mode="json"),
            "events": [e["message"] for e in self.store.events() if e["kind"] == "warmup"],
        }
        path, _ = checkpoint.save(entry, 0, state, self.backend.save_policies, keep_last=1)
        self.store.event(0, "warmup", f"format warm-up left in {path.parent.parent} for runs with the same inputs")

    def evaluate(self, step: int, samples: int = 1) -> dict[str, float]:
        """The held-out evaluation at `step` (training/evaluation.py)."""
        return self.evaluator.evaluate(step, samples)

    @property
    def constant(self) -> ConstantBaseline | None:
        return self.evaluator.constant

    @property
    def held_out(self) -> HeldOut:
        return self.evaluator.held_out

    # --- the run: steps, safe points, checkpoints -------------------------------------------------
    def run(self, progress: Progress | None = None) -> dict[str, float]:
        """Evaluate, then train until `train.steps` (evaluating every `eval_every` and at the end),
        checking for pause/stop at every step boundary and checkpointing every `checkpoint.every`."""
        train, every = self.task.train, self.task.checkpoint.every

        def tell(event: ProgressEvent) -> None:
            self.control.publish(
                step=event.step, phase=event.phase, paused=self.paused, last_checkpoint=self.last_checkpoint
            )
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
            if result.metrics.get("zero_std_frac") == 1.0 and step == 1:
                message = (
                    "every group of step 1 tied (all K candidates earned the same reward): no signal to train on; "
                    "a task that stays so spends its learner time on nothing (see docs/new-task.md: a format "
                    "warm-up, train.warmup_steps, the zero_std filter, or easier problems)"
                )
                self.store.event(step, "warning", message)
                tell(ProgressEvent("warning: " + message, step))
            self.promote(step)
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
        """What the run's evaluations say (training/evaluation.py), after its last step."""
        return {**self.evaluator.summary(self.step), "stopped": self.step < self.task.train.steps}

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
        state = {
            "step": step,
            **self._position(),
            "mlflow_run_id": self.tracker.run_id if self.tracker else None,
            "task": self.task.model_dump(mode="json"),
            "store": self.store.digest(step),
        }
        keep_last = self.task.checkpoint.keep_last
        # algorithm.overlap: the next step's rollout, made with the weights before this step's update,
        # which the checkpoint no longer holds; a resume takes it from here
        extra = {PREFETCHED: pickle.dumps(self.prefetched)} if self.prefetched is not None else None
        if not self.task.checkpoint.background:
            path, seconds = checkpoint.save(self.run_dir, step, state, self.backend.save_policies, keep_last, extra)
            self._checkpointed(step, path, seconds)
            return
        pending = checkpoint.begin(self.run_dir, step, state, extra)
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
        self._load(path, state)
        self.step, self.last_checkpoint = state["step"], state["step"]
        if (path / PREFETCHED).is_file():  # written by this run's own checkpoint, verified against its manifest
            self.prefetched = pickle.loads((path / PREFETCHED).read_bytes())
        return state

    def _load(self, path: Path, state: dict) -> None:
        """The policies (weights, optimizers), the driver's RNGs and the problems' position
        (_position) of a verified checkpoint folder: a resume's and a shared warm-up's."""
        self.backend.load_policies(path / "policies", state["step"])
        checkpoint.restore_driver_rng(path)
        self.cursor = state["cursor"]
        # checkpoints from before the curriculum have no stage: the task's own problems
        self.stage = state.get("stage", len(self.task.train.curriculum))
        self.stage_started = state.get("stage_started", 0)

    def _position(self) -> dict:
        """Where the training problems stand, as a checkpoint records it."""
        return {"cursor": self.cursor, "stage": self.stage, "stage_started": self.stage_started}
