"""The paper's comparison (Table 1's shape) at CPU scale: every regime, several seeds, one budget.

    .venv/bin/python benchmarks/reproduce.py [--task plan_path sokoban] [--seeds 0 1 2] [--only NAME ...]
        [--jobs 1] [--out DIR] [--report-only] [--set key=value ...]            (make reproduce)

Two task families, each on its `*_learns` settings (30 steps x 8 problems x K 4 after a 20-step
format warm-up, greedy evaluation on 64 held-out problems every 10 steps): Plan-Path
(tasks/plan_path_learns.yaml: 3x3, goal 1-2 moves away) and Sokoban (tasks/sokoban_learns.yaml:
6x6, one box, 1-2 moves). Trained regimes (Plan-Path's files; Sokoban's are named alike):

- single agent + GRPO        tasks/plan_path_learns_single_agent.yaml
- MAS + trajectory GRPO      tasks/plan_path_learns.yaml with algorithm.mode=mas_grpo
- MAS + AT-GRPO shared       tasks/plan_path_learns.yaml
- MAS + AT-GRPO per-role LoRA  tasks/plan_path_learns_per_role_lora.yaml
- MAS + AT-GRPO per-role full  tasks/plan_path_learns_per_role_full.yaml (the shared run's lr: it
  separates the split into two policies from LoRA)

The untrained rows are the step-0 evaluations of those runs (the same held-out problems for the
same seed; every MAS regime starts from the same base model, so MAS untrained is read from the
AT-GRPO shared runs). Each run is a real `mas-lab run --no-ray` (one process, so its CPU time is
exact) whose run folder stays under --out (checkpoints, log); once finished, its summary and its
store (xz-compressed) are kept in the repository, results/reproduce/<task>/<regime>/seed-<n>/, the
report is built from those alone, and a kept run is not run again. A run an earlier session left
unfinished continues from its last checkpoint (`mas-lab run
--resume`), so the script resumes where that session stopped, losing at most the step in flight
(runs go seed by seed: one seed of every regime first). After each per-role run, the swap ablation: `mas-lab eval --swap-policies` on its
final checkpoint. After every run the family's generated section of docs/results.md and its curves
(docs/images/reproduce_<task>.png) are rewritten from what is complete.
"""
from __future__ import annotations

import argparse
import json
import lzma
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from mas_lab.controller import wilson_interval

ROOT = Path(__file__).resolve().parents[1]
MAS_LAB = str(Path(sys.executable).parent / "mas-lab")
COMMON = ["train.eval_every=10"]
REGIME_NAMES = ("single agent + GRPO", "MAS + trajectory GRPO", "MAS + AT-GRPO shared", "MAS + AT-GRPO per-role LoRA",
                "MAS + AT-GRPO per-role full")
PER_ROLE = ("MAS + AT-GRPO per-role LoRA", "MAS + AT-GRPO per-role full")  # these get the swap ablation
STORE = "run.db.xz"  # a kept run's store, in its archive folder
UNTRAINED = {"single agent (before RL)": "single agent + GRPO", "MAS (before RL)": "MAS + AT-GRPO shared"}


@dataclass(frozen=True)
class Family:
    """One task family of the comparison: its task files (`<stem>.yaml`, `<stem>_single_agent.yaml`,
    `<stem>_per_role_lora.yaml`, `<stem>_per_role_full.yaml`), where its runs go, and its section of docs/results.md."""

    key: str
    title: str
    stem: str
    out: str
    setting: str  # the settings in words, for the report
    archive: str = ""  # where finished runs are kept in the repository (default: <out>/archive)

    @property
    def regimes(self) -> dict[str, tuple[str, list[str]]]:  # name -> (task file, overrides)
        base = f"tasks/{self.stem}.yaml"
        return {"single agent + GRPO": (f"tasks/{self.stem}_single_agent.yaml", []),
                "MAS + trajectory GRPO": (base, ["algorithm.mode=mas_grpo"]),
                "MAS + AT-GRPO shared": (base, []),
                "MAS + AT-GRPO per-role LoRA": (f"tasks/{self.stem}_per_role_lora.yaml", []),
                "MAS + AT-GRPO per-role full": (f"tasks/{self.stem}_per_role_full.yaml", [])}

    @property
    def begin(self) -> str:
        return f"<!-- reproduce:{self.key}:begin (written by benchmarks/reproduce.py) -->"

    @property
    def end(self) -> str:
        return f"<!-- reproduce:{self.key}:end -->"

    @property
    def image(self) -> str:
        return f"reproduce_{self.key}.png"


FAMILIES = {f.key: f for f in (
    Family("plan_path", "Plan-Path", "plan_path_learns", "sweeps/reproduce", "3x3, goal 1-2 moves away",
           "results/reproduce/plan_path"),
    Family("sokoban", "Sokoban", "sokoban_learns", "sweeps/reproduce-sokoban", "6x6, one box, solved in 1-2 moves",
           "results/reproduce/sokoban"),
)}


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-").replace("--", "-")


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def process_cpu(pid: int) -> float:
    """CPU seconds of a running process and of its children it has waited for (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime


def unfinished(folder: Path) -> Path | None:
    """The run folder an earlier, interrupted attempt left with a checkpoint to resume from; an
    attempt stopped before its first checkpoint is removed (it had nothing to keep)."""
    from mas_lab import checkpoint

    for run_dir in sorted(p.parent for p in (folder / "runs").glob("*/run.db")):
        if checkpoint.complete(run_dir):
            return run_dir
        shutil.rmtree(run_dir)
    return None


def run_regime(family: Family, name: str, seed: int, out: Path, extra: list[str]) -> dict | None:
    """One regime and seed: a fresh `mas-lab run`, or `mas-lab run --resume` of the attempt an
    earlier session left (a session that ends mid-run loses at most the step in flight). Wall and
    CPU time add up over the attempts (segments.json, written every 15 s while a run goes)."""
    folder = out / slug(name) / f"seed-{seed}"
    summary_file = folder / "summary.json"
    if summary_file.is_file():
        return json.loads(summary_file.read_text())
    task, overrides = family.regimes[name]
    folder.mkdir(parents=True, exist_ok=True)
    sets = [*COMMON, *overrides, *extra, f"train.seed={seed}", f"tracking.runs_dir={folder / 'runs'}",
            f"tracking.mlflow_uri=sqlite:///{(out / 'mlruns.db').resolve()}"]
    command = [MAS_LAB, "run", task, "--no-ray", *[a for s in sets for a in ("--set", s)]]
    resume_dir = unfinished(folder)
    segments_file = folder / "segments.json"
    segments = json.loads(segments_file.read_text()) if resume_dir and segments_file.is_file() else []
    launch = [MAS_LAB, "run", "--resume", str(resume_dir), "--no-ray"] if resume_dir else command
    print(f"[reproduce] {name} seed {seed}: {' '.join(launch[1:])}", file=sys.stderr, flush=True)
    segment = {"resumed": str(resume_dir) if resume_dir else None, "wall_s": 0.0, "cpu_s": 0.0}
    segments.append(segment)
    started = time.perf_counter()
    with open(folder / "run.log", "a" if resume_dir else "w") as log:
        proc = subprocess.Popen(launch, cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True)
        output: list[str] = []
        reader = threading.Thread(target=lambda: output.extend(proc.stdout), daemon=True)
        reader.start()
        polled = 0.0
        while True:  # wait4 gives this child's own CPU time (another job's children are not mixed in)
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                proc.returncode = os.waitstatus_to_exitcode(status)
                break
            if time.perf_counter() - polled >= 15:
                polled = time.perf_counter()
                try:
                    segment.update(wall_s=round(polled - started, 1), cpu_s=round(process_cpu(proc.pid), 1))
                except (OSError, ValueError, IndexError):
                    pass  # the process ended between wait4 and the read
                segments_file.write_text(json.dumps(segments, indent=1))
            time.sleep(0.5)
        reader.join()
    segment.update(wall_s=round(time.perf_counter() - started, 1), cpu_s=round(usage.ru_utime + usage.ru_stime, 1))
    segments_file.write_text(json.dumps(segments, indent=1))
    if proc.returncode != 0:
        print(f"[reproduce] {name} seed {seed} failed (exit {proc.returncode}); see {folder / 'run.log'}", file=sys.stderr)
        return None
    summary = last_json("".join(output))
    result = {"regime": name, "seed": seed, "task": task, "overrides": sets, "command": " ".join(command[1:]),
              "run_dir": str((ROOT / summary["run_dir"]).resolve()),
              "wall_s": round(sum(x["wall_s"] for x in segments), 1), "cpu_s": round(sum(x["cpu_s"] for x in segments), 1),
              "attempts": len(segments), "summary": summary}
    if name in PER_ROLE:
        result["swap"] = swap_eval(task, seed, Path(result["run_dir"]), folder)
    summary_file.write_text(json.dumps(result, indent=1))
    return result


def swap_eval(task: str, seed: int, run_dir: Path, folder: Path) -> dict | None:
    """The swap ablation: the trained per-role policies with the role -> policy map rotated."""
    from mas_lab import checkpoint

    checkpoints = checkpoint.complete(run_dir)  # sealed ones, in step order
    if not checkpoints:
        return None
    command = [MAS_LAB, "eval", task, "--checkpoint", str(checkpoints[-1]), "--swap-policies", "--no-ray",
               "--set", f"train.seed={seed}", "--set", f"tracking.runs_dir={folder / 'swap'}",
               "--set", f"tracking.mlflow_uri=sqlite:///{(folder.parent.parent / 'mlruns.db').resolve()}"]
    proc = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        print(f"[reproduce] swap eval failed: {proc.stderr[-2000:]}", file=sys.stderr)
        return None
    return {"checkpoint": checkpoints[-1].name, "command": " ".join(command[1:]), **last_json(proc.stdout)}


# --- the report ------------------------------------------------------------------------------------
def curves(result: dict) -> dict[str, list[tuple[int, float]]]:
    """eval success and reward per role against steps, from the run's kept store."""
    from mas_lab.store import RunStore

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "run.db"
        with lzma.open(result["store"]) as packed, open(path, "wb") as plain:
            shutil.copyfileobj(packed, plain)
        store = RunStore(path, create=False)
        try:
            rows = store.rows("SELECT step, key, value FROM metrics WHERE key = 'eval/success_rate' OR "
                              "(key LIKE 'reward/%' AND key NOT LIKE 'reward/%/%') ORDER BY step")
        finally:
            store.close()
    out: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        out.setdefault(row["key"], []).append((row["step"], row["value"]))
    return out


def cell(rates: list[tuple[int, float, int]]) -> dict:
    """Pooled success over seeds with its 95% Wilson interval, the mean and spread over seeds, and
    each seed's success (from (seed, success, episodes) triples)."""
    successes = sum(rate * n for _, rate, n in rates)
    n = sum(n for _, _, n in rates)
    low, high = wilson_interval(successes, n)
    per_seed = [rate for _, rate, _ in rates]
    return {"pooled": successes / n if n else 0.0, "low": low, "high": high, "n": n, "per_seed": per_seed,
            "by_seed": {seed: rate for seed, rate, _ in rates},
            "mean": statistics.fmean(per_seed) if per_seed else 0.0,
            "sd": statistics.stdev(per_seed) if len(per_seed) > 1 else 0.0}


def table(results: list[dict]) -> tuple[list[str], dict[str, dict]]:
    """The Table-1 rows of one family's complete runs (untrained, trained, constant answer)."""
    by_regime: dict[str, list[dict]] = {}
    for r in results:
        by_regime.setdefault(r["regime"], []).append(r)
    rows: dict[str, dict] = {}
    for name, source in UNTRAINED.items():
        runs = by_regime.get(source, [])
        if runs:
            rows[name] = {**cell([(r["seed"], r["summary"]["eval_before"], eval_n(r)) for r in runs]), "runs": runs,
                          "trained": False}
    for name in REGIME_NAMES:
        runs = by_regime.get(name, [])
        if runs:
            rows[name] = {**cell([(r["seed"], r["summary"]["eval_after"], eval_n(r)) for r in runs]), "runs": runs,
                          "trained": True}
    seeds = sorted({r["seed"] for r in results})
    if seeds:  # no model: the best fixed answer on each seed's held-out problems (mas_lab/baselines.py)
        best = [constant_baseline(results[0]["task"], seed) for seed in seeds]
        rows["constant answer (no model)"] = {**cell([(seed, b.success, b.problems) for seed, b in zip(seeds, best)]),
                                              "runs": [], "seeds": seeds, "trained": False,
                                              "note": "; ".join(sorted({repr(b.answer) for b in best}))}
    lines = ["| regime | seeds | held-out success, pooled [95% interval] | mean over seeds ± sd | per seed | CPU time |",
             "|---|---|---|---|---|---|"]
    for name, row in rows.items():
        runs = row["runs"]
        cpu = (f"{sum(r['cpu_s'] for r in runs) / 3600:.2f} h ({statistics.fmean(r['cpu_s'] for r in runs) / 3600:.2f} h a run)"
               if row["trained"] else row.get("note", "(in the trained runs)"))
        lines.append(f"| {name} | {', '.join(str(s) for s in row.get('seeds', [r['seed'] for r in runs]))} | {row['pooled']:.3f} "
                     f"[{row['low']:.3f}, {row['high']:.3f}] (n={row['n']}) | {row['mean']:.3f} ± {row['sd']:.3f} | "
                     f"{' / '.join(f'{x:.3f}' for x in row['per_seed'])} | {cpu} |")
    return lines, rows


def constant_baseline(task_file: str, seed: int):
    from mas_lab.baselines import task_baseline
    from mas_lab.config import load_task
    from mas_lab.envs import ENVS, ProblemPool

    task = load_task(ROOT / task_file)
    return task_baseline(task, ProblemPool(ENVS[task.env.name], task.env.params, seed, task.train.eval_problems).eval_set)


def eval_n(result: dict) -> int:
    from mas_lab.config import load_task

    return load_task(ROOT / result["task"]).train.eval_problems


def orderings(rows: dict[str, dict]) -> list[str]:
    """The pairs whose pooled intervals do not overlap and whose order holds on every seed both rows
    have: pooling counts the seeds' episodes as one sample, which understates the spread between
    seeds, so a pair that one seed contradicts is named as not claimed."""
    claimed, contradicted = [], []
    for a in rows:
        for b in rows:
            if a == b or rows[a]["low"] <= rows[b]["high"]:
                continue
            shared = sorted(rows[a]["by_seed"].keys() & rows[b]["by_seed"].keys())
            against = "; ".join(f"seed {s} gives {rows[a]['by_seed'][s]:.3f} against {rows[b]['by_seed'][s]:.3f}"
                                for s in shared if rows[a]["by_seed"][s] <= rows[b]["by_seed"][s])
            if against:
                contradicted.append(f"not claimed: {a} above {b} (the pooled intervals are apart, but {against})")
            else:
                claimed.append(f"{a} above {b}")
    return (claimed + contradicted) or ["no pair of regimes has non-overlapping intervals: no ordering is claimed"]


def plot(results: list[dict], image: Path, constant: dict | None = None) -> None:
    """Left: held-out success against steps, each seed faint, the mean over seeds bold, and the
    constant answer's pooled success with its 95% interval (grey). Right: the training reward of
    each role, mean over seeds (solid: the tool agent or the single agent; dashed: the planner)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    colours = dict(zip(REGIME_NAMES, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    by_regime: dict[str, list[dict[str, list[tuple[int, float]]]]] = {}
    for r in results:
        by_regime.setdefault(r["regime"], []).append(curves(r))
    for regime, runs in by_regime.items():
        colour, seeds = colours[regime], len(runs)
        for data in runs:
            if seeds > 1:
                steps, values = zip(*data.get("eval/success_rate", [(0, 0.0)]))
                left.plot(steps, values, color=colour, alpha=0.25, linewidth=1)
        steps, values = mean_curve([data.get("eval/success_rate", []) for data in runs])
        left.plot(steps, values, marker="o", color=colour, linewidth=2,
                  label=f"{regime} ({seeds} seed{'s' if seeds > 1 else ''})")
        roles = sorted({key for data in runs for key in data if key.startswith("reward/") and key != "reward/mean"})
        for key in roles:
            role = key.split("/", 1)[1]
            steps, values = mean_curve([data.get(key, []) for data in runs])
            right.plot(steps, values, color=colour, alpha=0.8, linestyle="--" if role == "planner" else "-",
                       label=f"{regime}: {role}")
    if constant:
        left.axhspan(constant["low"], constant["high"], color="grey", alpha=0.15)
        left.axhline(constant["pooled"], color="grey", linestyle=":", label="constant answer (no model), 95% interval")
    left.set_ylim(0, 1)
    left.set(title="held-out success (greedy, 64 problems): mean over seeds, each seed faint", xlabel="step",
             ylabel="success rate")
    right.set(title="training reward per role, mean over seeds", xlabel="step", ylabel="reward")
    left.legend(fontsize=7)
    right.legend(fontsize=6)
    fig.tight_layout()
    image.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(image, dpi=110)
    plt.close(fig)


def mean_curve(series: list[list[tuple[int, float]]]) -> tuple[list[int], list[float]]:
    """Mean over runs at each step, over the runs that have that step."""
    at: dict[int, list[float]] = {}
    for points in series:
        for step, value in points:
            at.setdefault(step, []).append(value)
    steps = sorted(at)
    return steps, [statistics.fmean(at[s]) for s in steps]


def progress(folder: Path) -> str:
    """" (reached step N here ...)" for a run with a checkpoint in the work folder, else "": `make
    reproduce` continues it on this machine; a new machine, without the ignored work folder, starts
    it again."""
    from mas_lab import checkpoint

    last = [found[-1] for p in (folder / "runs").glob("*/run.db") if (found := checkpoint.complete(p.parent))]
    return (f" (reached step {int(last[-1].name.split('-')[1])} on the machine that wrote this; continued from its "
            "checkpoint only there)") if last else ""


def run_dtype(result: dict) -> str:
    """The dtype a kept run computed in: what its actors reported (`summary.precision`), or, for a
    run made before they reported it, its task's dtype (those ran on a CPU with avx512_bf16)."""
    reported = set((result["summary"].get("precision") or {}).values())
    if reported:
        return "+".join(sorted(reported))
    import yaml

    kept = Path(result["store"]).parent / "task.yaml"
    task = yaml.safe_load(kept.read_text()) if kept.is_file() else {}
    return "+".join(sorted({p.get("dtype", "float32") for p in task.get("policies", {}).values()})) or "float32"


def precision_line(results: list[dict]) -> str:
    """Which runs computed in which dtype: `dtype: auto` is bf16 only on a CPU that has it, so runs
    made on different machines may differ in precision (mas_lab/precision.py)."""
    by_dtype: dict[str, list[str]] = {}
    for r in results:
        by_dtype.setdefault(run_dtype(r), []).append(f"{r['regime']} seed {r['seed']}")
    if len(by_dtype) == 1:
        return f"Every run computed in {next(iter(by_dtype))}."
    return ("Precision differs between runs (`dtype: auto` is bfloat16 only on a CPU with native bf16; the "
            "machines changed between sessions): " + "; ".join(f"{d}: {', '.join(names)}" for d, names in
                                                            sorted(by_dtype.items())) + ".")


def swap_lines(results: list[dict]) -> list[str]:
    """The swap ablation of the per-role runs, one line per regime and seed."""
    lines = []
    for r in results:
        if s := r.get("swap"):
            lines.append(f"- {r['regime']}, seed {r['seed']}: trained {r['summary']['eval_after']:.3f} -> swapped "
                         f"{s['success_rate']:.3f} [{s['success_ci_low']:.3f}, {s['success_ci_high']:.3f}]")
    return lines


def report(family: Family, results: list[dict], out: Path) -> None:
    """Rewrite the family's section of docs/results.md and its curves; nothing before its first run."""
    (out / "results.json").write_text(json.dumps(results, indent=1))
    if not results:  # a section written from runs that are not kept any more says so
        if family.begin in (ROOT / "docs" / "results.md").read_text():
            write_section(family, [family.begin, "", f"### The paper's comparison at CPU scale ({family.title})", "",
                                   f"No run of this family is kept in `{family.archive or 'the archive'}/` yet: "
                                   f"`make reproduce TASKS={family.key}` makes them.", "", family.end])
        return
    image = ROOT / "docs" / "images" / family.image
    lines, rows = table(results)
    plot(results, image, rows.get("constant answer (no model)"))
    swaps = swap_lines(results)
    cpu_h = sum(r["cpu_s"] for r in results) / 3600
    wall_h = sum(r["wall_s"] for r in results) / 3600
    done = {(r["regime"], r["seed"]) for r in results}
    missing = [f"{name} seed {seed}{progress(out / slug(name) / f'seed-{seed}')}"
               for seed in sorted({r['seed'] for r in results} | {0, 1, 2})
               for name in REGIME_NAMES if (name, seed) not in done]
    command = f"make reproduce TASKS={family.key}"
    text = [family.begin, "", f"### The paper's comparison at CPU scale ({family.title})", "",
            f"Command: `{command}` (`.venv/bin/python benchmarks/reproduce.py --task {family.key} --seeds 0 1 2`: "
            "one run at a time with a torch thread per core; some kept runs went two at a time with one thread each, "
            "`--jobs 2`, so CPU and wall times are a budget, not a speed comparison; each run's command, with its "
            "thread setting, is kept in its summary.json). "
            f"Every regime on the settings of `tasks/{family.stem}.yaml` ({family.setting}) with the same budget: "
            "30 steps x 8 problems x K = 4, "
            "greedy evaluation on the same 64 held-out problems (per seed) every 10 steps; runs in `--no-ray` "
            "(one process). The before-RL rows are the step-0 evaluations of the trained runs (the base model after "
            "the task's format warm-up, `train.warmup_steps`, if any). The constant-answer "
            "row replies the same best fixed answer (of 1 to 4 moves) to every problem of each seed's held-out set, "
            "without a model (`mas_lab/baselines.py`): a regime above it answers from what it reads. Intervals are 95% "
            "Wilson intervals of the success pooled over seeds. Each finished run's summary and store are kept in "
            f"`{family.archive or 'the archive'}/<regime>/seed-<n>/` with the resolved task.yaml: after "
            "`xz -dk run.db.xz` the folder is a run for `mas-lab replay` and `mas-lab tui`.", "", *lines, "",
            f"Runs complete: {len(results)}; total CPU time {cpu_h:.2f} h, wall time {wall_h:.2f} h on 2 cores"
            + (f" ({resumed} of them continued from a checkpoint after an interruption, times added up)"
               if (resumed := sum(r.get("attempts", 1) > 1 for r in results)) else "") + "."
            + (f" Not yet run: {', '.join(missing)}." if missing else "") + " " + precision_line(results), "",
            "Orderings the intervals support (pooled intervals apart, and the same order on every seed both regimes ran): " + "; ".join(orderings(rows)) + ".", ""]
    if swaps:
        text += ["Swap ablation (per-role runs, final checkpoint, role -> policy map swapped, `mas-lab eval "
                 "--swap-policies`):", "", *swaps, ""]
    text += [f"![learning curves](images/{family.image})", ""]
    text.append(family.end)
    write_section(family, text)


def write_section(family: Family, text: list[str]) -> None:
    """Replace the family's generated section of docs/results.md (or append it)."""
    results_md = ROOT / "docs" / "results.md"
    current = results_md.read_text()
    block = "\n".join(text)
    if family.begin in current:
        head, rest = current.split(family.begin, 1)
        current = head + block + rest.split(family.end, 1)[1]
    else:
        current = current.rstrip("\n") + "\n\n" + block + "\n"
    results_md.write_text(current)


def archive_folder(archive: Path, name: str, seed: int) -> Path:
    return archive / slug(name) / f"seed-{seed}"


def keep(result: dict, archive: Path) -> None:
    """Keep a finished run in the repository: its summary, its resolved task.yaml and its store,
    xz-compressed (a 30-step store of ~2.6 MB keeps in ~0.2 MB), so the tables and curves can be
    rebuilt on any clone and a later session, on a new machine whose sweeps/ is gone, does not run
    it again. Checkpoints, logs and MLflow's database stay in the work folder."""
    folder = archive_folder(archive, result["regime"], result["seed"])
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "run.db"
        source, target = sqlite3.connect(Path(result["run_dir"]) / "run.db"), sqlite3.connect(copy)
        try:
            source.backup(target)  # a consistent copy, whatever the journal mode
        finally:
            target.close()
            source.close()
        with open(copy, "rb") as plain, lzma.open(folder / STORE, "wb", preset=9) as packed:
            shutil.copyfileobj(plain, packed)
    shutil.copyfile(Path(result["run_dir"]) / "task.yaml", folder / "task.yaml")  # the resolved task
    (folder / "summary.json").write_text(json.dumps(result, indent=1) + "\n")  # last: it marks the run kept


def complete(out: Path, archive: Path | None = None) -> list[dict]:
    """The finished runs: those kept in the archive (default <out>/archive), after keeping there
    any run finished in the work folder `out` that is not kept yet."""
    archive = archive or out / "archive"
    for path in sorted(out.glob("*/seed-*/summary.json")):
        result = json.loads(path.read_text())
        if not (archive_folder(archive, result["regime"], result["seed"]) / "summary.json").is_file():
            keep(result, archive)
    found = []
    for path in sorted(archive.glob("*/seed-*/summary.json")):
        found.append({**json.loads(path.read_text()), "store": str(path.parent / STORE)})
    return sorted(found, key=lambda r: (REGIME_NAMES.index(r["regime"]), r["seed"]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", nargs="+", choices=list(FAMILIES), default=["plan_path"], help="task families")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--only", nargs="+", default=None, help="regime names (default: all)")
    parser.add_argument("--out", default=None, help="run folders of a single family (default: the family's, "
                                                    "e.g. sweeps/reproduce)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once; each gets cores/jobs torch threads "
                                                            "(2 on 2 cores: the same throughput as 1, each run "
                                                            "twice as long: docs/measurements.md)")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--set", action="append", default=[], help="an override for every run (smoke tests)")
    args = parser.parse_args()
    if args.out and len(args.task) > 1:
        parser.error("--out names the folder of one family: give one --task with it")
    families = [FAMILIES[key] for key in args.task]
    outs = {f.key: (ROOT / (args.out or f.out)).resolve() for f in families}
    archives = {f.key: (ROOT / f.archive if f.archive and not args.out else outs[f.key] / "archive").resolve()
                for f in families}
    for out in outs.values():
        out.mkdir(parents=True, exist_ok=True)
    names = [n for n in REGIME_NAMES if args.only is None or n in args.only]
    extra = list(args.set)
    if args.jobs > 1 and not any(s.startswith("resources.torch_threads=") for s in extra):
        extra.append(f"resources.torch_threads={max(1, (os.cpu_count() or 1) // args.jobs)}")
    # seed by seed, and within a seed regime by regime across the families: the first complete
    # tables come first, and two jobs run the same regime of two families side by side
    queue = [(f, name, seed) for seed in args.seeds for name in names for f in families
             if not (archive_folder(archives[f.key], name, seed) / "summary.json").is_file()]  # kept: done
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                if not queue:
                    return
                family, name, seed = queue.pop(0)
            if run_regime(family, name, seed, outs[family.key], extra) is not None:
                with lock:
                    report(family, complete(outs[family.key], archives[family.key]), outs[family.key])

    if not args.report_only:
        workers = [threading.Thread(target=work) for _ in range(max(1, args.jobs))]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    for family in families:
        results = complete(outs[family.key], archives[family.key])
        report(family, results, outs[family.key])
        print(json.dumps([{"task": family.key} | {k: r[k] for k in ("regime", "seed", "wall_s", "cpu_s")} | {
            "before": r["summary"]["eval_before"], "after": r["summary"]["eval_after"]} for r in results]))


if __name__ == "__main__":
    main()
