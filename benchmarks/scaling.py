"""Cost curves: how one training step's time, generation throughput and peak memory grow with the
work, one axis at a time, printed as JSON (and, with --png, drawn).

    .venv/bin/python benchmarks/scaling.py [--task tasks/plan_path_learns.yaml] [--axes k,problems,...]
        [--steps 2] [--png docs/images/scaling.png] [--out results/benchmarks/scaling.json [--merge]]

Every point is one `benchmarks/step_time.py --no-ray` process (the engine and learner in one
process, so its peak resident memory is the point's; `--ray` runs the product's Ray path instead) on
the task with one setting changed from the base (problems per step 4, K 4, the task's turns, roles and
response lengths), `algorithm.filter=none` (every sample is trained, so the learner does the whole
work) and no warm-up. The first step of each point is a warm-up; the rest are averaged. Axes:

- k: candidates per (agent, turn), 2-16
- problems: problems per step, 2-32
- turns: env.max_turns, 1-8 (a Plan-Path episode ends early when solved, rarely before training)
- roles: 1 (the task's single-agent file) or 2 (the team); the tasks have at most two roles
- max_new_tokens: every role's response cap, 16-256

For each axis: the fitted growth exponent b of step time ~ a * x^b (least squares on logs; 1 is
linear in the work), and the knee: the value with the lowest step seconds per unit of work (time / x);
beyond it, more work per step is no longer amortised. Run on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AXES: dict[str, list[int]] = {
    "k": [2, 4, 8, 16],
    "problems": [2, 4, 8, 16, 32],
    "turns": [1, 2, 4, 8],
    "roles": [1, 2],
    "max_new_tokens": [16, 32, 64, 128, 256],
}
BASE = [
    "train.problems_per_step=4",
    "algorithm.k=4",
    "algorithm.filter=none",
    "train.warmup_steps=0",
    "train.eval_every=0",
]


def single_agent_file(task: str) -> str:
    path = Path(task)
    return str(path.with_name(f"{path.stem}_single_agent{path.suffix}"))


def overrides(axis: str, value: int, roles: int) -> list[str]:
    """The settings of one point, on top of BASE."""
    if axis == "k":
        return [f"algorithm.k={value}"]
    if axis == "problems":
        return [f"train.problems_per_step={value}"]
    if axis == "turns":
        return [f"env.max_turns={value}"]
    if axis == "max_new_tokens":
        return [f"roles.{i}.sampling.max_new_tokens={value}" for i in range(roles)]
    return []


def _is_base(override: str) -> bool:
    """An override that sets what BASE already sets (k 4, 4 problems)."""
    return override in BASE


def run_point(task: str, sets: list[str], steps: int, ray: bool) -> dict:
    command = [sys.executable, str(ROOT / "benchmarks" / "step_time.py"), task, "--steps", str(steps)]
    command += [] if ray else ["--no-ray"]
    for s in sets:
        command += ["--set", s]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    report = json.loads(done.stdout[done.stdout.index("{") :])
    mean = report["mean_excluding_first"]
    return {
        "step_s": mean["time/step"],
        "rollout_s": mean["time/rollout"],
        "learner_s": mean["time/learner"],
        "tokens_generated": mean["tokens_generated"],
        "tokens_per_s": mean["tokens_per_s"],
        "peak_rss_mb": report["peak_rss_mb"],
    }


def growth_exponent(xs: list[float], ys: list[float]) -> float | None:
    """b in y = a * x^b, least squares on log y against log x."""
    points = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y > 0]
    if len(points) < 2:
        return None
    mx = sum(p[0] for p in points) / len(points)
    my = sum(p[1] for p in points) / len(points)
    sxx = sum((p[0] - mx) ** 2 for p in points)
    return sum((p[0] - mx) * (p[1] - my) for p in points) / sxx if sxx else None


def knee(xs: list[float], ys: list[float]) -> float | None:
    """The x with the lowest y / x (the cheapest work per unit); None for fewer than 2 points."""
    if len(xs) < 2:
        return None
    return min(zip(xs, ys), key=lambda p: p[1] / p[0])[0]


def draw(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes = [a for a in result["axes"] if len(result["axes"][a]["points"]) > 1]
    fig, grid = plt.subplots(1, len(axes), figsize=(3.2 * len(axes), 3.0), squeeze=False)
    for ax, axis in zip(grid[0], axes):
        points = result["axes"][axis]["points"]
        xs = [p["value"] for p in points]
        for key, label in (("step_s", "step"), ("rollout_s", "rollout"), ("learner_s", "learner")):
            ax.plot(xs, [p[key] for p in points], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        b = result["axes"][axis]["exponent"]
        ax.set_title(f"{axis} (b = {b:.2f})" if b is not None else axis, fontsize=9)
        ax.set_xlabel(axis, fontsize=8)
        ax.tick_params(labelsize=7)
    grid[0][0].set_ylabel("seconds per step", fontsize=8)
    grid[0][0].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", default="tasks/plan_path_learns.yaml")
    parser.add_argument("--axes", default=",".join(AXES), help=f"some of {list(AXES)}")
    parser.add_argument("--steps", type=int, default=2, help="steps per point (the first is a warm-up)")
    parser.add_argument("--values", action="append", default=[], help="AXIS=v1,v2,... instead of the defaults")
    parser.add_argument("--set", action="append", default=[], help="an override of every point")
    parser.add_argument("--ray", action="store_true", help="the Ray path (peak RSS is then the driver's only)")
    parser.add_argument("--png", type=Path)
    parser.add_argument("--out", type=Path, help="written after every axis, so a stopped run keeps what it measured")
    parser.add_argument("--merge", action="store_true", help="keep --out's other axes (same task, base and path)")
    args = parser.parse_args()
    values = dict(AXES)
    for spec in args.values:
        axis, _, listed = spec.partition("=")
        values[axis] = [int(v) for v in listed.split(",")]
    result: dict = {"task": args.task, "base": BASE + args.set, "ray": args.ray, "steps": args.steps, "axes": {}}
    if args.merge and args.out and args.out.exists():
        kept = json.loads(args.out.read_text())
        if {k: kept.get(k) for k in ("task", "base", "ray")} != {k: result[k] for k in ("task", "base", "ray")}:
            parser.error(f"--merge: {args.out} holds another task, base or path; write to another --out")
        result["axes"] = kept["axes"]
    measured: dict[tuple, dict] = {}  # the base point recurs on every axis: measured once
    for axis in args.axes.split(","):
        if axis not in AXES:
            parser.error(f"--axes: unknown axis '{axis}'; allowed: {list(AXES)}")
        points = []
        for value in values[axis]:
            task = single_agent_file(args.task) if axis == "roles" and value == 1 else args.task
            roles = value if axis == "roles" else 2
            sets = BASE + args.set + [o for o in overrides(axis, value, roles) if not _is_base(o)]
            key = (task, tuple(sets))
            if key not in measured:
                measured[key] = run_point(task, sets, args.steps, args.ray)
            point = measured[key]
            points.append({"value": value, **point})
            print(json.dumps({"axis": axis, "value": value, **point}), file=sys.stderr, flush=True)
        xs, ys = [p["value"] for p in points], [p["step_s"] for p in points]
        result["axes"][axis] = {
            "points": points,
            "exponent": growth_exponent(xs, ys),
            "knee": knee(xs, ys) if axis != "roles" else None,
        }
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=1) + "\n")
    if args.png:
        draw(result, args.png)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
