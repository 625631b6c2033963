"""The held-out evaluation (the paper's evaluation protocol, Sec. 5): the team's greedy episodes on
fixed held-out problems and the hard split, beside what the no-model baselines solve on the same
problems, and the run's summary read from those evaluations with the paired tests.

Carved out of Trainer (Algorithm 1 trains; this measures): one Evaluator per run, built once with
the task's problem pool, the run store and the policy's generate function.
"""

from __future__ import annotations

import functools
import statistics
import time

from mas_lab.analysis.evidence import HeldOut, run_evidence
from mas_lab.analysis.reporting import (
    baselines_from_metrics,
    hard_split_text,
    paired_verdict,
    reward_metrics,
    update_diagnostics,
    verdict,
    wilson_interval,
)
from mas_lab.config import TaskConfig
from mas_lab.envs import ENVS, ProblemPool
from mas_lab.records.store import RunStore
from mas_lab.sandbox import raise_refusal
from mas_lab.training.baselines import (
    RULE_LABELS,
    ConstantBaseline,
    RuleResults,
    answer_turns,
    rule_results,
    task_baseline,
)
from mas_lab.training.episodes import Episode, Generate, call_seed, tree_rollout
from mas_lab.training.metric_names import (
    CONSTANT_CI_HIGH,
    CONSTANT_CI_LOW,
    CONSTANT_SUCCESS,
    DISTINCT_ANSWERS,
    EVAL_CI_HIGH,
    EVAL_CI_LOW,
    EVAL_PREFIX,
    EVAL_SUCCESS,
    EVAL_TIME,
    HARD_CI_HIGH,
    HARD_CI_LOW,
    HARD_PROBLEMS,
    HARD_SUCCESS,
    OPTIMUM_MOVES,
    rule_key,
)


class Evaluator:
    """A run's held-out evaluation: the problems (the pool's evaluation set and hard split), the
    baselines without a model on them (computed once), and the store the results go to."""

    def __init__(self, task: TaskConfig, pool: ProblemPool, store: RunStore, generate: Generate):
        self.task, self.pool, self.store, self.generate = task, pool, store, generate

    def evaluate(self, step: int, samples: int = 1) -> dict[str, float]:
        """Episodes on the fixed held-out problems, one trajectory each (K = 1): greedy when
        `samples` is 1, else `samples` sampled trajectories per problem at the roles' settings.
        Success rate with a 95% Wilson interval, mean turns, mean reward per role; beside it, on
        the same problems, what the baselines without a model solve (the best constant answer and,
        in the move games, the reading rules), and the team's success on the hard split (the
        problems the either-order reading rule does not solve: `train.hard_eval_problems` more
        held-out ones when set, else the hard members of the evaluation set)."""
        problems, hard_extra = self.pool.eval_set, self.pool.hard_set
        if not problems:
            return {}
        started_wall, started = time.time(), time.perf_counter()
        episodes = [
            Episode(i * samples + j, p, self.pool.make(p))
            for i, p in enumerate([*problems, *hard_extra])
            for j in range(samples)
        ]
        tree_rollout(
            self.task, episodes, self.generate, 1, call_seed(self.task.train.seed, "eval"), greedy=samples == 1
        )
        raise_refusal()
        main = episodes[: len(problems) * samples]
        metrics = reward_metrics(main, prefix=EVAL_PREFIX)
        low, high = wilson_interval(sum(e.success for e in main), len(main))
        metrics[EVAL_CI_LOW], metrics[EVAL_CI_HIGH] = low, high
        played = ((e.index, t.turn, t.role, t.candidates[t.chosen].response) for e in main for t in e.turns)
        env_cls = ENVS[self.task.env.name]
        answers = env_cls.first_answers(env_cls.Params.coerce(self.task.env.params), played)
        metrics[DISTINCT_ANSWERS] = float(len(answers))
        constant = self.constant
        if constant is not None:
            metrics[CONSTANT_SUCCESS] = constant.success
            metrics[CONSTANT_CI_LOW], metrics[CONSTANT_CI_HIGH] = wilson_interval(constant.solved, constant.problems)
        metrics.update(self._rule_metrics(episodes, samples))
        metrics[EVAL_TIME] = time.perf_counter() - started
        self.store.write_step(step, started_wall, episodes, "eval", metrics=metrics)
        hard = (
            f"; hard split {metrics[HARD_SUCCESS]:.3f} on {int(metrics[HARD_PROBLEMS])} problems"
            if HARD_SUCCESS in metrics
            else ""
        )
        self.store.event(
            step,
            "eval",
            f"success {metrics[EVAL_SUCCESS]:.3f} on {len(main)} episodes"
            + (f"; best constant answer {constant.answer!r} {constant.success:.3f}" if constant else "")
            + "".join(f"; {name} {metrics[rule_key(name)]:.3f}" for name in RULE_LABELS if rule_key(name) in metrics)
            + hard,
        )
        return metrics

    def _rule_metrics(self, episodes: list[Episode], samples: int) -> dict[str, float]:
        """The reading rules' success on the evaluation set (eval/rule/NAME with its interval), the
        BFS optimum's mean move count, and the team's and the rules' success on the hard split
        (where the environment has one)."""
        rules = self.rules
        if rules is None:
            return {}
        n = len(self.pool.eval_set)
        out: dict[str, float] = {}
        for name, solved in rules.solved.items():
            out[rule_key(name)] = sum(solved[:n]) / n
            out[rule_key(name) + "_ci_low"], out[rule_key(name) + "_ci_high"] = wilson_interval(sum(solved[:n]), n)
        if "optimum" in rules.moves:
            out[OPTIMUM_MOVES] = statistics.fmean(rules.moves["optimum"][:n])
        if rules.hard_rule is None:  # no hard split (Sudoku)
            return out
        if self.pool.hard_set:  # the extra hard problems follow the evaluation set
            hard = list(range(n, len(rules.hard)))
        else:
            hard = [i for i in range(n) if rules.hard[i]]
        out[HARD_PROBLEMS] = float(len(hard))
        if hard:
            outcomes = [e.success for i in hard for e in episodes[i * samples : (i + 1) * samples]]
            out[HARD_SUCCESS] = sum(outcomes) / len(outcomes)
            out[HARD_CI_LOW], out[HARD_CI_HIGH] = wilson_interval(sum(outcomes), len(outcomes))
            for name, solved in rules.solved.items():
                out[rule_key(name, hard=True)] = sum(solved[i] for i in hard) / len(hard)
        return out

    @functools.cached_property
    def constant(self) -> ConstantBaseline | None:
        """The best fixed answer on the held-out problems (baselines.py), or None; computed once."""
        return task_baseline(self.task, self.pool.eval_set) if self.pool.eval_set else None

    @functools.cached_property
    def held_out(self) -> HeldOut:
        """The held-out problems of the paired comparisons: the evaluation set and the hard split."""
        return HeldOut.from_pool(self.pool.eval_set, self.pool.hard_set, self.rules)

    @functools.cached_property
    def rules(self) -> RuleResults | None:
        """The reading rules on the evaluation set and then the extra hard problems; computed once."""
        env_cls = ENVS[self.task.env.name]
        return rule_results(
            env_cls, self.pool.params, [*self.pool.eval_set, *self.pool.hard_set], answer_turns(self.task)
        )

    def summary(self, step: int) -> dict:
        """Held-out success before training and after it, with 95% intervals, and what they say.
        "After" is the evaluation at the final step only: a run stopped early has none (None)."""
        metrics = self.store.metrics()
        evals = sorted(s for s, m in metrics.items() if EVAL_SUCCESS in m)

        def at(step: int | None) -> dict | None:
            if step is None:
                return None
            m = metrics[step]
            return {"step": step, "success": m[EVAL_SUCCESS], "ci": [m.get(EVAL_CI_LOW), m.get(EVAL_CI_HIGH)]}

        before = at(evals[0] if evals else None)
        after = at(evals[-1] if evals and evals[-1] == step and step > evals[0] else None)
        best = self.constant if evals else None
        constant = (
            None
            if best is None
            else {
                "answer": best.answer,
                "success": best.success,
                "ci": list(wilson_interval(best.solved, best.problems)),
            }
        )
        last = metrics[after["step"]] if after else None
        baselines = baselines_from_metrics(last, RULE_LABELS) if last else {}
        evidence = (
            run_evidence(self.task, self.store, after["step"], before["step"] if before else None, self.held_out)
            if after
            else {}
        )
        if evidence.get("change") or evidence.get("baselines"):
            said = paired_verdict(before, after, evidence)
        else:  # the evaluations hold different problems: the intervals only
            said = verdict(before, after, constant)
            if last and HARD_PROBLEMS in last:
                said += f". On the hard split (a detour needed): {hard_split_text(last)}"
        return {
            "eval_before": before["success"] if before else None,
            "eval_after": after["success"] if after else None,
            "before": before,
            "after": after,
            # a run stopped early has no "after"; its latest evaluation is still what it last measured
            "latest": at(evals[-1]) if after is None and len(evals) > 1 else None,
            "constant": constant,
            "baselines": baselines,
            "hard_after": (
                {
                    "success": last[HARD_SUCCESS],
                    "problems": int(last[HARD_PROBLEMS]),
                    "ci": [last[HARD_CI_LOW], last[HARD_CI_HIGH]],
                }
                if last and HARD_SUCCESS in last
                else None
            ),
            "verdict": said,
            "update": update_diagnostics(metrics),
            "paired": {
                key: (
                    value.as_dict()
                    if key == "change"
                    else {label: v.as_dict() for label, v in value.items()}
                    if isinstance(value, dict)
                    else value
                )
                for key, value in evidence.items()
            },
            "steps": step,
        }
