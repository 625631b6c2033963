"""One precision a table: `dtype: auto` resolves by the machine (bfloat16 where the CPU or GPU has it
natively, float32 elsewhere: mas_lab/modeling/precision.py), and a study runs over sessions on
whatever machine each gets. Without a check a family whose kept runs computed in float32 takes its
next seed in bf16, and its paired verdicts then compare precisions as well as methods. Before
anything trains, every cell to run is resolved here and refused where it would compute in another
dtype than the family's kept runs, all of which agree (a family that already mixes is the report's
precision line, not refused again). The way on is named: a machine where the kept dtype is native,
or `--set policies.NAME.dtype=<the kept dtype>`."""

from __future__ import annotations

from pathlib import Path

from mas_lab.config import TaskConfig, load_task
from mas_lab.modeling.precision import resolve
from mas_lab.study.families import Cell
from mas_lab.study.report import run_dtype
from mas_lab.study.runner import complete

KNOWN = {"float32", "bfloat16", "bfloat16+float32"}  # what run_dtype names; else an unrecorded "auto"
WHERE = {"float32": "Run it on a machine without native bf16", "bfloat16": "Run it where bf16 is native"}


class MixedPrecision(ValueError):
    """A cell would compute in another dtype than its family's kept runs; the message says how to go on."""


def cell_task(cell: Cell, extra: list[str]) -> TaskConfig:
    """The task a cell's run resolves to: its regime's task file under the study's, the regime's
    and this call's overrides."""
    task_file, overrides = cell.family.regimes[cell.regime]
    return load_task(Path(cell.family.root) / task_file, [*cell.family.common, *overrides, *extra])


def task_dtype(task: TaskConfig) -> str:
    """The dtype(s) a task's run computes in on this machine, as the kept runs' summaries name them
    ("float32", "bfloat16", or both joined by "+"): its policies' dtypes resolved where the learner
    runs (a GPU where `resources.learner_gpus` asks for one, else this CPU)."""
    device = "cuda" if task.resources.learner_gpus > 0 else "cpu"
    return "+".join(sorted({resolve(p.dtype, device) for p in task.policies.values()}))


def check(todo: list[Cell], extra: list[str]) -> None:
    """Raise MixedPrecision, before anything trains, for the first cell whose dtype here differs
    from the one dtype its family's kept runs computed in. For runs made on this machine (a Ray
    cluster's nodes resolve `auto` each on its own; the report's precision line says what they did)."""
    kept: dict[str, set[str]] = {}
    for cell in todo:
        family = cell.family
        if family.key not in kept:
            kept[family.key] = {run_dtype(r) for r in complete(Path(family.out), family.archive_dir, family.names)}
        if len(kept[family.key]) != 1 or not kept[family.key] <= KNOWN:
            continue  # nothing kept yet, already mixed (the report's precision line says so), or unrecorded
        (theirs,) = kept[family.key]
        task = cell_task(cell, extra)
        ours = task_dtype(task)
        if ours != theirs:
            names = (
                " ".join(f"--set policies.{name}.dtype={theirs}" for name in task.policies)
                if "+" not in theirs
                else "each policy's dtype as in the kept runs' task.yaml"
            )
            raise MixedPrecision(
                f"{family.key}: {cell.regime} seed {cell.seed} would compute in {ours} on this machine, and every "
                f"kept run of {family.key} computed in {theirs} (`dtype: auto` resolves by the machine); its paired "
                f"verdicts would then compare precisions too. {WHERE.get(theirs, 'Run it')}, or name it: {names}"
                + (" (emulated bf16 is tens of times slower)" if theirs == "bfloat16" else "")
            )
