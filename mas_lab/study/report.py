"""The comparison's report: a table per family (every trained regime pooled over seeds with 95%
Wilson intervals and per-seed values, the untrained rows, and every baseline without a model on the
same held-out problems: the constant answer and the reading rules), the orderings that the
paired test supports on the main and the hard split, the swap ablation, the curves, and the family's section of
docs/results/ (linked from docs/results.md)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import statistics
from pathlib import Path

import yaml

from mas_lab.analysis.paired import compare_paired, on_common_problems, sentence
from mas_lab.analysis.reporting import update_diagnostics, wilson_interval
from mas_lab.config import load_task
from mas_lab.envs import ENVS, ProblemPool
from mas_lab.records import checkpoint
from mas_lab.study import families
from mas_lab.study.families import Family, slug
from mas_lab.study.plots import kept_store, plot
from mas_lab.training.baselines import (
    HELPER_ROWS,
    RULE_ROWS,
    answer_turns,
    baseline_outcomes,
    is_hard,
    rule_results,
    task_baseline,
)


def cell(rates: list[tuple[int, float, int]]) -> dict:
    """Pooled success over seeds with its 95% Wilson interval, the mean and spread over seeds, and
    each seed's success (from (seed, success, episodes) triples)."""
    successes = sum(rate * n for _, rate, n in rates)
    n = sum(n for _, _, n in rates)
    low, high = wilson_interval(successes, n)
    per_seed = [rate for _, rate, _ in rates]
    return {
        "pooled": successes / n if n else 0.0,
        "low": low,
        "high": high,
        "n": n,
        "per_seed": per_seed,
        "by_seed": {seed: rate for seed, rate, _ in rates},
        "mean": statistics.fmean(per_seed) if per_seed else 0.0,
        "sd": statistics.stdev(per_seed) if len(per_seed) > 1 else 0.0,
    }


def table(results: list[dict], family: Family) -> tuple[list[str], dict[str, dict]]:
    """The Table-1 rows of one family's complete runs (untrained, trained, constant answer, reading
    rules), in the study's order of regimes."""
    root = Path(family.root)
    by_regime: dict[str, list[dict]] = {}
    for r in results:
        by_regime.setdefault(r["regime"], []).append(r)
    rows: dict[str, dict] = {}
    for name, source in family.untrained:
        runs = by_regime.get(source, [])
        if runs:
            rows[name] = {
                **cell([(r["seed"], r["summary"]["eval_before"], eval_n(r, root)) for r in runs]),
                "runs": runs,
                "trained": False,
            }
    for name in family.names:
        runs = by_regime.get(name, [])
        if runs:
            rows[name] = {
                **cell([(r["seed"], r["summary"]["eval_after"], eval_n(r, root)) for r in runs]),
                "runs": runs,
                "trained": True,
            }
    seeds = sorted({r["seed"] for r in results})
    best = [constant_baseline(results[0]["task"], seed, root) for seed in seeds]
    # no model: the best fixed answer on each seed's held-out problems (mas_lab/training/baselines.py), for
    # a task that has one
    known = [b for b in best if b is not None]
    if seeds and len(known) == len(best):
        rows["constant answer (no model)"] = {
            **cell([(seed, b.success, b.problems) for seed, b in zip(seeds, known)]),
            "runs": [],
            "seeds": seeds,
            "trained": False,
            "note": "; ".join(sorted({repr(b.answer) for b in known})),
        }
    if seeds:
        rows.update(rule_baselines(results[0]["task"], seeds, root))
    lines = [
        "| regime | seeds | held-out success, pooled [95% interval] | mean over seeds ± sd | per seed | CPU time |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        runs = row["runs"]
        cpu = (
            f"{sum(r['cpu_s'] for r in runs) / 3600:.2f} h ({statistics.fmean(r['cpu_s'] for r in runs) / 3600:.2f} h a run)"
            if row["trained"]
            else row.get("note", "(in the trained runs)")
        )
        lines.append(
            f"| {name} | {', '.join(str(s) for s in row.get('seeds', [r['seed'] for r in runs]))} | {row['pooled']:.3f} "
            f"[{row['low']:.3f}, {row['high']:.3f}] (n={row['n']}) | {row['mean']:.3f} ± {row['sd']:.3f} | "
            f"{' / '.join(f'{x:.3f}' for x in row['per_seed'])} | {cpu} |"
        )
    return lines, rows


def constant_baseline(task_file: str, seed: int, root: Path = families.ROOT):
    task = load_task(root / task_file)
    return task_baseline(
        task, ProblemPool(ENVS[task.env.name], task.env.params, seed, task.train.eval_problems).eval_set
    )


def rule_baselines(task_file: str, seeds: list[int], root: Path = families.ROOT) -> dict[str, dict]:
    """The reading rules (mas_lab/training/baselines.py: the move games' and Sudoku's) on each seed's
    held-out problems, as table rows; the note of the move games' either-order row gives the BFS
    optimum's mean move count and how many problems need a detour (the hard split). Empty for a
    task without rules."""
    task = load_task(root / task_file)
    env_cls = ENVS[task.env.name]
    found = []
    for seed in seeds:
        pool = ProblemPool(env_cls, task.env.params, seed, task.train.eval_problems)
        found.append(rule_results(env_cls, pool.params, pool.eval_set, answer_turns(task)))
    known = [r for r in found if r is not None]
    if not known or len(known) != len(found):
        return {}
    rows = {}
    helper = getattr(env_cls.Params.coerce(task.env.params), "tool_helper", "none") != "none"
    for name in known[0].solved:
        if name not in RULE_ROWS or (name in HELPER_ROWS and not helper):
            continue
        note = ""
        if name == known[0].hard_rule and "optimum" in known[0].moves:
            moves = statistics.fmean(m for r in known for m in r.moves["optimum"])
            note = f"BFS optimum: {moves:.2f} moves; {sum(sum(r.hard) for r in known)} problems need a detour"
        rows[RULE_ROWS[name]] = {
            **cell(
                [
                    (seed, sum(r.solved[name]) / len(r.solved[name]), len(r.solved[name]))
                    for seed, r in zip(seeds, known)
                ]
            ),
            "runs": [],
            "seeds": seeds,
            "trained": False,
            "note": note,
        }
    return rows


def hard_split(
    results: list[dict], family: Family
) -> tuple[dict[str, dict], dict[int, set[str]], dict[str, dict[int, dict]]]:
    """The hard split (held-out problems the either-order reading rule does not solve: a detour is
    needed), where the runs evaluated one: its table's rows (each trained regime's final success
    there from its summary, pooled over seeds, and each rule replayed without a model on the same
    problems), each seed's hard problem ids, and each rule's outcome by problem id ({row: {seed:
    {problem id: solved}}}), for the paired verdicts. Empty when no run has one, and when the task
    evaluates no separate hard split (`train.hard_eval_problems: 0`): its runs then report the few
    detour problems inside the main set (6 of 192 over the Plan-Path letters seeds), which the
    either-order row counts ("N problems need a detour") and which are too few for a table of their own."""
    with_hard = [r for r in results if (r["summary"].get("hard_after") or {}).get("problems")]
    if not with_hard:
        return {}, {}, {}
    task = load_task(Path(family.root) / with_hard[0]["task"])
    if not task.train.hard_eval_problems:
        return {}, {}, {}
    rows: dict[str, dict] = {}
    for name in family.names:
        runs = [r for r in with_hard if r["regime"] == name]
        if runs:
            hard = [r["summary"]["hard_after"] for r in runs]
            rows[name] = {**cell([(r["seed"], h["success"], h["problems"]) for r, h in zip(runs, hard)]), "runs": runs}
    env_cls = ENVS[task.env.name]
    params = env_cls.Params.coerce(task.env.params)
    helper = getattr(params, "tool_helper", "none") != "none"
    shown = {name: label for name, label in RULE_ROWS.items() if name not in HELPER_ROWS or helper}
    ids: dict[int, set[str]] = {}
    rules: dict[str, dict[int, dict]] = {}
    for seed in sorted({r["seed"] for r in with_hard}):  # the extra hard problems the runs evaluated
        pool = ProblemPool(
            env_cls,
            params,
            seed,
            task.train.eval_problems,
            hard_size=task.train.hard_eval_problems,
            hard=functools.partial(is_hard, env_cls, params, max_turns=answer_turns(task)),
        )
        ids[seed] = {p.id for p in pool.hard_set}
        found = rule_results(env_cls, params, pool.hard_set, answer_turns(task))
        for name, label in shown.items():
            if found is not None and found.solved.get(name):
                rules.setdefault(label, {})[seed] = {p.id: s for p, s in zip(pool.hard_set, found.solved[name])}
    for label, by_seed in rules.items():
        per_seed = [(seed, sum(solved.values()) / len(solved), len(solved)) for seed, solved in by_seed.items()]
        rows[label] = {**cell(per_seed), "runs": []}
    return rows, ids, rules


def hard_table(results: list[dict], family: Family) -> list[str]:
    """The hard split's table (hard_split): each trained regime beside the rules on the same
    problems; empty where the task has no separate hard split."""
    rows, _, _ = hard_split(results, family)
    if not rows:
        return []
    lines = ["| on the hard split | held-out success, pooled [95% interval] | per seed |", "|---|---|---|"]
    for name, row in rows.items():
        lines.append(
            f"| {name} | {row['pooled']:.3f} [{row['low']:.3f}, {row['high']:.3f}] (n={row['n']}) | "
            f"{' / '.join(f'{x:.3f}' for x in row['per_seed'])} |"
        )
    return lines


def hard_outcomes(
    rows: dict[str, dict], ids: dict[int, set[str]], rules: dict[str, dict[int, dict]], read: dict[str, dict[int, dict]]
) -> dict[str, dict[int, dict]]:
    """The hard split's outcomes by problem id ({row: {seed: {problem id: solved}}}): a regime row's
    from its final evaluation (`read`, every evaluated problem) restricted to that seed's hard
    problems (`ids`), a rule's as hard_split replayed it (`rules`)."""
    out = dict(rules)
    for name in rows:
        for seed, found in read.get(name, {}).items():
            if seed in ids:
                out.setdefault(name, {})[seed] = {i: s for i, s in found.items() if i in ids[seed]}
    return out


def budget(family: Family) -> str:
    """The family's training budget in words, from its first regime's task file (a study's regimes
    share one budget): K is the largest group a turn samples, and where a regime's roles sample
    their own K (AT-GRPO's tree, Sec. 4.1) each role's K is named."""
    tasks = [load_task(Path(family.root) / file, overrides) for file, overrides in family.regimes.values()]
    task = tasks[0]
    k = max(task.k_of(role) for role in task.roles)
    own = next((t for t in tasks if any(role.k for role in t.roles)), None)
    per_role = (
        " (" + ", ".join(f"{role.name} {own.k_of(role)}" for role in own.roles) + " in the team's tree)" if own else ""
    )
    hard = f" + {task.train.hard_eval_problems} hard" if task.train.hard_eval_problems else ""
    return (
        f"{task.train.steps} steps x {task.train.problems_per_step} problems x K = {k}{per_role} after "
        f"{task.train.warmup_steps} warm-up steps, {task.train.eval_problems}{hard} held-out problems"
    )


def eval_n(result: dict, root: Path = families.ROOT) -> int:
    return load_task(root / result["task"]).train.eval_problems


def baseline_rows(rows: dict[str, dict]) -> list[str]:
    """The table's rows that use no model (the constant answer, the reading rules)."""
    return [name for name in rows if name.endswith("(no model)")]


def run_outcomes(rows: dict[str, dict]) -> dict[str, dict[int, dict]]:
    """Each model row's held-out outcome per problem, per seed, on every problem its evaluation
    held (main and hard split): {row: {seed: {problem id: solved}}}. A trained row's from its runs'
    final evaluation, an untrained row's from their step-0 evaluation (kept stores)."""
    out: dict[str, dict[int, dict]] = {}
    for name, row in rows.items():
        for r in row["runs"]:
            which = r["summary"].get("after" if row["trained"] else "before") or {}
            if "step" not in which:
                continue
            with kept_store(r) as store:
                out.setdefault(name, {})[r["seed"]] = store.eval_outcomes(which["step"])
    return out


def outcomes(
    rows: dict[str, dict], task_file: str, root: Path = families.ROOT, read: dict[str, dict[int, dict]] | None = None
) -> dict[str, dict[int, dict]]:
    """Each row's held-out outcome per problem on the main split, per seed: {row: {seed: {problem
    id: solved}}}. A model row's from its kept store (run_outcomes, or `read` when already read)
    restricted to the seed's main held-out problems, so that a pair of regimes is compared on the
    table's problems and the hard split only in its own section; a baseline row's replayed without
    a model on those problems."""
    read = run_outcomes(rows) if read is None else read
    baseline_names = {"constant": "constant answer (no model)", **RULE_ROWS}
    task = load_task(root / task_file)
    seeds = sorted({seed for by_seed in read.values() for seed in by_seed})
    out: dict[str, dict[int, dict]] = {}
    for seed in seeds:
        problems = ProblemPool(ENVS[task.env.name], task.env.params, seed, task.train.eval_problems).eval_set
        ids = {p.id for p in problems}
        for name, by_seed in read.items():
            if seed in by_seed:
                out.setdefault(name, {})[seed] = {i: s for i, s in by_seed[seed].items() if i in ids}
        for key, (_, solved) in baseline_outcomes(task, problems).items():
            if baseline_names.get(key) in rows:
                out.setdefault(baseline_names[key], {})[seed] = {p.id: s for p, s in zip(problems, solved)}
    return out


def paired_rows(found: dict[str, dict[int, dict]], a: str, b: str):
    """Row `a` against row `b` on the problems both have, seed by seed (mas_lab/analysis/paired.py); None
    where they share no seed."""
    pairs = []
    for seed in sorted(found.get(a, {}).keys() & found.get(b, {}).keys()):
        x, y = on_common_problems(found[a][seed], found[b][seed])
        if x:
            pairs.append((x, y))
    return compare_paired(pairs) if pairs else None


def baseline_verdicts(rows: dict[str, dict], found: dict[str, dict[int, dict]]) -> dict[str, str]:
    """Each model row against every baseline row, paired on the same problems of each seed, in the
    words of the paired test ("above ...; not distinguishable from ...; below ..."), each with n,
    the discordant counts per seed and the exact p-value."""
    baselines = [name for name in baseline_rows(rows) if name in found]
    out = {}
    for name in rows:
        if name in baselines:
            continue
        verdicts = {
            b.removesuffix(" (no model)"): v for b in baselines if (v := paired_rows(found, name, b)) is not None
        }
        if verdicts:
            out[name] = sentence(verdicts)
    return out


def orderings(names: list[str], found: dict[str, dict[int, dict]]) -> tuple[list[str], list[str]]:
    """Every pair of regimes, paired on the same held-out problems seed by seed: the orderings the
    paired test supports (significant pooled over seeds, and no seed the other way), and a table
    of every pair with its discordant counts per seed, p-value and difference (no table where no
    two regimes share a seed)."""
    claimed: list[str] = []
    lines: list[str] = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            v = paired_rows(found, a, b)
            if v is None:
                continue
            low, high = v.diff_ci
            per_seed = ", ".join(f"{s.a_only}/{s.b_only}" for s in v.seeds)
            # a pair that shares only some of the seeds its regimes ran says on which it was compared
            shared = sorted(found[a].keys() & found[b].keys())
            seeds = f"seed{'s' if len(shared) > 1 else ''} {', '.join(map(str, shared))}"
            only = (
                "" if set(shared) == found[a].keys() | found[b].keys() else f" (on {seeds} only: the seeds both have)"
            )
            word = v.ordering(a, b) + only
            lines.append(
                f"| {a} | {b} | {per_seed} | {v.p_value:.3g} | {v.diff:+.3f} [{low:+.2f}, {high:+.2f}] | {word} |"
            )
            if v.word == "above":
                claimed.append(f"{a} above {b}{only}")
            elif v.word == "below":
                claimed.append(f"{b} above {a}{only}")
    header = [
        "| regime A | regime B | discordant A only / B only, per seed | exact p | A - B [95%] | verdict |",
        "|---|---|---|---|---|---|",
    ]
    return claimed, [*header, *lines] if lines else []


def orderings_sentence(claimed: list[str], pair_lines: list[str]) -> str:
    """The claimed orderings in words; "none" says whether pairs were compared at all."""
    if claimed:
        return "; ".join(claimed)
    return "none: no pair of regimes is distinguishable" if pair_lines else "none yet: no two regimes share a seed"


def progress(folder: Path) -> str:
    """ " (reached step N here ...)" for a run with a checkpoint in the work folder, else "": `make
    reproduce` continues it on this machine; a new machine, without the ignored work folder, starts
    it again."""
    last = [found[-1] for p in (folder / "runs").glob("*/run.db") if (found := checkpoint.complete(p.parent))]
    return (
        (
            f" (reached step {int(last[-1].name.split('-')[1])} on the machine that wrote this; continued from its "
            "checkpoint only there)"
        )
        if last
        else ""
    )


def run_dtype(result: dict) -> str:
    """The dtype a kept run computed in: what its actors reported (`summary.precision`), or, for a
    run made before they reported it, its task's dtype (those ran on a CPU with avx512_bf16)."""
    reported = set((result["summary"].get("precision") or {}).values())
    if reported:
        return "+".join(sorted(reported))

    kept = Path(result["store"]).parent / "task.yaml"
    task = yaml.safe_load(kept.read_text()) if kept.is_file() else {}
    return "+".join(sorted({p.get("dtype", "float32") for p in task.get("policies", {}).values()})) or "float32"


def reused_line(results: list[dict]) -> str:
    """Which runs this study took from another's archive instead of training them again (the same
    resolved task: mas_lab/study/reuse.py), and from where."""
    by_source: dict[str, list[str]] = {}
    for r in results:
        if r.get("reused_from"):
            by_source.setdefault(str(Path(r["reused_from"]).parent), []).append(f"{r['regime']} seed {r['seed']}")
    if not by_source:
        return ""
    return (
        f" {sum(len(v) for v in by_source.values())} runs are taken from another study's archive, the same resolved "
        "task trained once (`reused_from` in their summary.json): "
        + "; ".join(f"{', '.join(names)} from `{source}/`" for source, names in by_source.items())
        + "."
    )


def precision_line(results: list[dict]) -> str:
    """Which runs computed in which dtype: `dtype: auto` is bf16 only on a CPU that has it, so runs
    made on different machines may differ in precision (mas_lab/modeling/precision.py)."""
    by_dtype: dict[str, list[str]] = {}
    for r in results:
        by_dtype.setdefault(run_dtype(r), []).append(f"{r['regime']} seed {r['seed']}")
    if len(by_dtype) == 1:
        return f"Every run computed in {next(iter(by_dtype))}."
    return (
        "Precision differs between runs (`dtype: auto` is bfloat16 only on a CPU with native bf16; the "
        "machines changed between sessions): "
        + "; ".join(f"{d}: {', '.join(names)}" for d, names in sorted(by_dtype.items()))
        + "."
    )


def swap_lines(results: list[dict]) -> list[str]:
    """The swap ablation of the per-role runs, one line per regime and seed."""
    lines = []
    for r in results:
        if s := r.get("swap"):
            lines.append(
                f"- {r['regime']}, seed {r['seed']}: trained {r['summary']['eval_after']:.3f} -> swapped "
                f"{s['success_rate']:.3f} [{s['success_ci_low']:.3f}, {s['success_ci_high']:.3f}]"
            )
    return lines


def start_digest(result: dict) -> str | None:
    """sha256 of the run's first held-out evaluation: every greedy reply of every turn, in
    (problem, turn, role, candidate) order. Two runs with the same digest started training from
    the same model on the same problems; None for a run with no evaluation."""
    with kept_store(result) as store:
        first = store.first_step("eval")
        rows = store.step_replies(first) if first is not None else []
    if not rows:
        return None
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def starts_line(results: list[dict]) -> str:
    """Whether a seed's arms are paired: the regimes of one seed that began from the same
    before-RL replies (start_digest) differ by their training only; arms that began apart (another
    team, warm-up or code) are compared through the pooled intervals alone."""
    by_seed: dict[int, dict[str | None, list[str]]] = {}
    for r in results:
        by_seed.setdefault(r["seed"], {}).setdefault(start_digest(r), []).append(r["regime"])
    shared = {seed: groups for seed, groups in by_seed.items() if sum(map(len, groups.values())) > 1}
    if not shared:
        return ""
    apart = {seed: groups for seed, groups in shared.items() if len(groups) > 1}
    if not apart:
        return (
            "Paired starts: on seed"
            + ("s " if len(shared) > 1 else " ")
            + ", ".join(map(str, sorted(shared)))
            + ", every regime's first held-out evaluation has the same greedy replies, byte for byte (the same "
            "model after the warm-up, on the same problems), so a seed's arms differ by their training only."
        )
    said = "; ".join(
        f"seed {seed}: " + " | ".join(", ".join(names) for names in groups.values())
        for seed, groups in sorted(apart.items())
    )
    return (
        "Starting points (each run's first held-out evaluation, its greedy replies compared byte for byte; "
        "regimes in one group began from the same model on the same problems, so their same-seed values are "
        "paired; | separates groups that began apart: another team, warm-up or code): " + said + "."
    )


SPIKE = 3.0  # a gradient-norm spike: a step whose norm exceeds SPIKE times its run's median


def kept_metrics(result: dict) -> dict[int, dict[str, float]]:
    """A kept run's metrics by step (RunStore.metrics), read once per report process: the report's
    update and spike lines both read them."""
    store = Path(result["store"])
    return _metrics_of(str(store), store.stat().st_mtime_ns)


@functools.lru_cache(maxsize=None)
def _metrics_of(store: str, mtime_ns: int) -> dict[int, dict[str, float]]:  # mtime: a store replaced is read again
    with kept_store({"store": store}) as opened:
        return opened.metrics()


def kept_answers(result: dict) -> dict[int, int]:
    """A kept run's count of different first answers on the main held-out problems at each evaluation
    (Env.first_answers; its resolved task.yaml beside the store says which episodes are the main set);
    empty when the run kept no task file. The store is unpacked once per process (plots.kept_store)."""
    store = Path(result["store"])
    return _answers_of(str(store), store.stat().st_mtime_ns)


@functools.lru_cache(maxsize=None)
def _answers_of(store: str, mtime_ns: int) -> dict[int, int]:  # mtime: a store replaced is read again
    task_file = Path(store).parent / "task.yaml"
    if not task_file.is_file():
        return {}
    task = load_task(task_file)
    env_cls = ENVS[task.env.name]
    params, main = env_cls.Params.coerce(task.env.params), task.train.eval_problems
    with kept_store({"store": store}) as opened:
        return {
            step: len(env_cls.first_answers(params, (row for row in opened.chosen_replies(step) if row[0] < main)))
            for step in opened.episode_steps("eval")
        }


def grad_spikes(results: list[dict]) -> list[str]:
    """Per regime, the steps whose gradient norm (of any policy, `grad_norm/<policy>`) exceeded
    SPIKE times the median of that policy's nonzero norms in its run, summed over its seeds, and the
    largest ratio to the median: the spikes Dr. MAS (arXiv 2602.08847) reports under a normalisation
    shared by agents whose rewards differ in scale. Steps with no sample trained (norm 0) are left out.
    Where the store has `samples/<policy>`, the median number of samples trained at the spike steps
    and at the other steps: the gradient of a mean over few samples (most groups filtered for equal
    rewards) is noisier, so its norm tends to be larger whatever the advantage."""
    by_regime: dict[str, list] = {}
    for r in results:
        spikes, worst = 0, 0.0
        at_spikes: list[float] = []  # samples trained at the spike steps
        elsewhere: list[float] = []
        metrics = kept_metrics(r)
        keys = sorted({k for m in metrics.values() for k in m if k.startswith(("grad_norm/", "samples/"))})
        series = {key: [(step, m[key]) for step, m in metrics.items() if key in m] for key in keys}
        for key, points in series.items():
            norms = [(step, v) for step, v in points if v > 0] if key.startswith("grad_norm/") else []
            if len(norms) < 3:
                continue
            median = statistics.median(v for _, v in norms)
            spikes += sum(v > SPIKE * median for _, v in norms)
            worst = max(worst, max(v for _, v in norms) / median)
            samples = dict(series.get("samples/" + key.removeprefix("grad_norm/"), []))
            for step, v in norms:
                if step in samples:
                    (at_spikes if v > SPIKE * median else elsewhere).append(samples[step])
        entry = by_regime.setdefault(r["regime"], [0, 0.0, 0, [], []])
        entry[0], entry[1], entry[2] = entry[0] + spikes, max(entry[1], worst), entry[2] + 1
        entry[3] += at_spikes
        entry[4] += elsewhere
    return [
        f"{name}: {spikes} over {runs} run{'s' if runs > 1 else ''} (the largest norm {worst:.1f}x its run's median"
        + (f"; samples trained at the spike steps, median {statistics.median(at):g}" if at else "")
        + (f"; at the other steps, median {statistics.median(rest):g}" if rest else "")
        + ")"
        for name, (spikes, worst, runs, at, rest) in by_regime.items()
    ]


def update_lines(results: list[dict]) -> list[str]:
    """Per regime, what its updates did, per seed and policy (reporting.update_diagnostics over each
    run's kept store): the share of optimizer steps whose gradient-norm clip bound and the median
    norm before and after the clip. Arms compared at one update size should bind alike; a clip that
    binds on every step of one arm and few of another gives them different step sizes (issue 50).
    Runs from before the store recorded the clip are left out."""
    by_regime: dict[str, list[str]] = {}
    for r in sorted(results, key=lambda r: r["seed"]):
        found = update_diagnostics(kept_metrics(r))
        for policy, d in found.items():
            by_regime.setdefault(r["regime"], []).append(
                f"seed {r['seed']} {policy} {d['clip_bound_share']:.0%} "
                f"({d['grad_norm_median']:.2g} -> {d['grad_norm_clipped_median']:.2g})"
            )
    return [f"{name}: {', '.join(parts)}" for name, parts in by_regime.items()]


def answers_lines(results: list[dict]) -> list[str]:
    """Per regime and seed, how many different first answers the team gave over the held-out problems
    at each evaluation, as step:count, recounted from the kept store's greedy replies by the rule of
    `eval/distinct_answers` (Env.first_answers: each problem's first reply that is
    an answer, so a single agent's program is not counted): 1 is one reply to every problem, a
    collapsed policy; which arms leave it, and when, is read here."""
    by_regime: dict[str, list[str]] = {}
    for r in sorted(results, key=lambda r: r["seed"]):
        if counts := kept_answers(r):
            shown = ", ".join(f"{step}:{count}" for step, count in sorted(counts.items()))
            by_regime.setdefault(r["regime"], []).append(f"seed {r['seed']} {shown}")
    return [f"{name}: {'; '.join(parts)}" for name, parts in by_regime.items()]


def report(family: Family, results: list[dict], out: Path) -> None:
    """Write the family's results.json and, where the study names them, its curves and its section
    of the Markdown report; a section whose runs are not kept any more says so."""
    (out / "results.json").write_text(json.dumps(results, indent=1))
    if not family.results_md:
        if results and family.images:
            lines, rows = table(results, family)
            plot(
                results,
                Path(family.images) / family.image,
                rows.get("constant answer (no model)"),
                family.names,
                eval_n(results[0], Path(family.root)),
            )
        return
    command = (family.command or f"mas-lab study {family.study_file} --task {{key}}").replace("{key}", family.key)
    if not results:
        if Path(family.results_md).is_file() and family.begin in Path(family.results_md).read_text():
            write_section(
                family,
                [
                    family.begin,
                    "",
                    f"## {family.heading}: {family.title}",
                    "",
                    f"No run of this family is kept in `{family.shown(family.archive_dir)}/` yet: `{command}` makes them.",
                    "",
                    family.end,
                ],
            )
        return
    image = Path(family.images) / family.image
    lines, rows = table(results, family)
    plot(results, image, rows.get("constant answer (no model)"), family.names, eval_n(results[0], Path(family.root)))
    read = run_outcomes(rows)
    found = outcomes(rows, results[0]["task"], Path(family.root), read)
    claimed, pair_lines = orderings([n for n in rows if rows[n]["trained"]], found)
    hard_rows, hard_ids, hard_rules = hard_split(results, family)
    hard_found = hard_outcomes(hard_rows, hard_ids, hard_rules, read)
    hard_claimed, hard_pairs = orderings([n for n in hard_rows if n in family.names], hard_found)
    swaps = swap_lines(results)
    cpu_h = sum(r["cpu_s"] for r in results) / 3600
    wall_h = sum(r["wall_s"] for r in results) / 3600
    done = {(r["regime"], r["seed"]) for r in results}
    missing = [
        f"{name} seed {seed}{progress(out / slug(name) / f'seed-{seed}')}"
        for seed in sorted({r["seed"] for r in results} | set(family.seeds))
        for name in family.names
        if (name, seed) not in done
    ]
    text = [
        family.begin,
        "",
        f"## {family.heading}: {family.title}",
        "",
        f"Command: `{command}` (`mas-lab study {family.study_file} --task {family.key}`: the study file names "
        "every regime's task file and overrides; one run at a time with a torch thread per core; some kept runs "
        "went two at a time with one thread each, `--jobs 2`, so CPU and wall times are a budget, not a speed "
        "comparison; each run's command, with its thread setting, is kept in its summary.json). "
        f"Every regime on the settings of `tasks/{family.stem}.yaml` ({family.setting}) with the same budget: "
        f"{budget(family)}, "
        "greedy evaluation on the same held-out problems (per seed) every 10 steps; runs in `--no-ray` "
        "(one process). The before-RL rows are the step-0 evaluations of the trained runs (the base model after "
        "the task's format warm-up, `train.warmup_steps`, if any). The constant-answer "
        "row replies the same best fixed answer (of 1 to 4 moves) to every problem of each seed's held-out set, "
        "without a model (`mas_lab/training/baselines.py`): a regime above it answers from what it reads. The reading-rule "
        "rows answer from the observation with a few lines of code and no model (the straight way to the goal, rows "
        "first; the same with columns first when rows first is blocked; one legal move toward the goal a turn): a "
        "regime not distinguishable from them may have learned to read, and only one above them plans. Intervals "
        "in the table are 95% Wilson intervals of the success pooled over seeds (they treat seeds' episodes as one "
        "sample: the per-seed values show the spread); every comparison in words is paired on the same problems. Each finished run's summary and store are kept in "
        f"`{family.shown(family.archive_dir)}/<regime>/seed-<n>/` with the resolved task.yaml: after "
        "`xz -dk run.db.xz` the folder is a run for `mas-lab replay` and `mas-lab tui`.",
        "",
        *lines,
        "",
        *([*hard, ""] if (hard := hard_table(results, family)) else []),
        f"Runs complete: {len(results)}; total CPU time {cpu_h:.2f} h, wall time {wall_h:.2f} h on 2 cores"
        + (
            f" ({resumed} of them continued from a checkpoint after an interruption, times added up)"
            if (resumed := sum(r.get("attempts", 1) > 1 for r in results))
            else ""
        )
        + "."
        + (f" Not yet run: {', '.join(missing)}." if missing else "")
        + " "
        + precision_line(results)
        + reused_line(results),
        "",
        "Against the baselines without a model, paired on the same held-out problems of each seed (exact "
        "McNemar per seed, the exact stratified test over seeds; `mas_lab/analysis/paired.py`): "
        + " ".join(f"{name} is {verdict}." for name, verdict in baseline_verdicts(rows, found).items()),
        "",
        "Orderings between the regimes that the paired test supports (significant at 0.05 pooled over seeds, "
        "and no seed the other way): " + orderings_sentence(claimed, pair_lines) + ".",
        "",
        *([*pair_lines, ""] if pair_lines else []),
    ]
    if hard_rows:
        text += [
            "On the hard split, paired on the same problems of each seed (the tables' regimes and rules, "
            "the same tests): "
            + " ".join(f"{name} is {verdict}." for name, verdict in baseline_verdicts(hard_rows, hard_found).items()),
            "",
        ]
    if hard_pairs:  # two regimes or more share a seed with a hard split
        text += [
            "Orderings on the hard split: " + orderings_sentence(hard_claimed, hard_pairs) + ".",
            "",
            *hard_pairs,
            "",
        ]
    if starts := starts_line(results):
        text += [starts, ""]
    if updates := update_lines(results):
        text += [
            "What the updates did (the share of optimizer steps whose gradient-norm clip bound; the median "
            "gradient norm before -> after the clip): " + "; ".join(updates) + ".",
            "",
        ]
    if answers := answers_lines(results):
        text += [
            "Different first answers over the held-out problems at each evaluation (step:count; 1 is one reply "
            "to every problem; a single agent's programs are not answers): " + " | ".join(answers) + ".",
            "",
        ]
    if spikes := grad_spikes(results):
        text += [
            f"Gradient-norm spikes (steps above {SPIKE:g}x the median of their run's nonzero norms): "
            + "; ".join(spikes)
            + ".",
            "",
        ]
    if swaps:
        text += [
            "Swap ablation (per-role runs, final checkpoint, role -> policy map swapped, `mas-lab eval "
            "--swap-policies`):",
            "",
            *swaps,
            "",
        ]
    link = os.path.relpath(image, Path(family.results_md).parent)
    text += [f"![learning curves]({link})", ""]
    text.append(family.end)
    write_section(family, text)


def write_section(family: Family, text: list[str]) -> None:
    """Replace the family's generated section of its Markdown report (or append it)."""
    results_md = Path(family.results_md)
    current = results_md.read_text() if results_md.is_file() else "# Results\n"
    block = "\n".join(text)
    if family.begin in current:
        head, rest = current.split(family.begin, 1)
        current = head + block + rest.split(family.end, 1)[1]
    else:
        current = current.rstrip("\n") + "\n\n" + block + "\n"
    results_md.parent.mkdir(parents=True, exist_ok=True)
    results_md.write_text(current)
