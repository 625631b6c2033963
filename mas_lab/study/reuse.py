"""Runs one study takes from another: a regime whose run another study already kept (the credit
study's AT-GRPO and trajectory-GRPO arms are the paper study's MAS + AT-GRPO shared and MAS +
trajectory GRPO) is copied into this study's archive instead of being trained again, but only when
it is the same run: the same resolved task (task file, every override, the seed), placement aside
(`tracking`: where it was written; `resources`: threads and CPUs; `train.warmup_cache`: whether its
warm-up was its own or a shared one with the same inputs) and `dtype: auto` read as the
dtype the run computed in, trained by the same code (the package fingerprint each run records,
mas_lab/records/provenance.py: a changed trainer makes a different run of the same task file). A kept run
that differs in anything else is refused, naming the fields, before anything is written; a seed
the other study has not kept is simply run here."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from mas_lab.config import TaskFileError, load_task
from mas_lab.modeling.precision import resolve
from mas_lab.records.provenance import code_version
from mas_lab.study.families import Family, archive_folder, cells
from mas_lab.study.runner import STORE

PLACEMENT = ("tracking", "resources")  # where and on how many threads a run went: not what it is


class ReuseError(ValueError):
    """A kept run named for reuse is not the run this study would make; the message says why."""


@dataclass(frozen=True)
class Reuse:
    family: Family
    regime: str
    seed: int
    source: Path  # the other study's kept folder of this seed
    summary: dict  # its summary.json

    @property
    def target(self) -> Path:
        return archive_folder(self.family.archive_dir, self.regime, self.seed)


def _computed(task: dict, precision: dict | None) -> dict:
    """The task with every policy's `dtype: auto` replaced by the dtype it computes in: what the
    run's actors reported (a kept run), else what this machine resolves it to (a run to be made)."""
    reported = set((precision or {}).values())
    policies = {}
    for name, policy in task.get("policies", {}).items():
        dtype = policy.get("dtype", "auto")
        if dtype == "auto":
            dtype = next(iter(reported)) if len(reported) == 1 else resolve("auto", "cpu")
        policies[name] = {**policy, "dtype": dtype}
    # where the warm-up came from (its own, or a shared one with the same inputs) does not change the run
    train = {k: v for k, v in task.get("train", {}).items() if k != "warmup_cache"}
    return {k: v for k, v in {**task, "policies": policies, "train": train}.items() if k not in PLACEMENT}


def differences(a: object, b: object, where: str = "") -> list[str]:
    """The dotted paths at which two task dumps differ (each with both values)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [
            d for key in sorted(set(a) | set(b), key=str) for d in differences(a.get(key), b.get(key), f"{where}.{key}")
        ]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{where}.{i}")]
    return [] if a == b else [f"{where.lstrip('.')}: {a!r} here, {b!r} kept"]


def planned(family: Family, regime: str, seed: int, extra: list[str]) -> dict:
    """The resolved task this study would run for (regime, seed), as a plain dict."""
    task, overrides = family.regimes[regime]
    sets = [*family.common, *overrides, *extra, f"train.seed={seed}"]
    return load_task(Path(family.root) / task, sets).model_dump(mode="json")


def check(family: Family, regime: str, seed: int, extra: list[str]) -> Reuse | None:
    """The kept run of another study to take for (regime, seed): None when this study keeps it
    already, names no source for the regime, or the source has not kept this seed; ReuseError when
    the source's run differs from the one this study would make."""
    sources = dict(family.reuse)
    if regime not in sources:
        return None
    source = Path(sources[regime]) / f"seed-{seed}"
    kept_here = archive_folder(family.archive_dir, regime, seed) / "summary.json"
    if kept_here.is_file() or not (source / "summary.json").is_file():
        return None
    kept = json.loads((source / "summary.json").read_text())
    try:
        theirs = load_task(source / "task.yaml", stored=True).model_dump(mode="json")
    except TaskFileError as exc:
        raise ReuseError(f"{family.key}: {regime} seed {seed}: the kept run {source} cannot be read: {exc}") from None
    ours = planned(family, regime, seed, extra)
    found = differences(_computed(ours, None), _computed(theirs, kept.get("summary", {}).get("precision")))
    if found:
        raise ReuseError(
            f"{family.key}: {regime} seed {seed}: the run kept in {source} is not the one this study makes "
            f"({'; '.join(found[:6])}{'; ...' if len(found) > 6 else ''}); remove it from the study's reuse: "
            "or make the task match"
        )
    made_by, here = kept.get("summary", {}).get("code") or [], code_version()
    if made_by != [here]:
        said = (
            "records no code fingerprint (made before runs recorded one)"
            if not made_by
            else f"was trained by other mas_lab code ({' then '.join(made_by)}; here {here})"
        )
        raise ReuseError(
            f"{family.key}: {regime} seed {seed}: the run kept in {source} {said}, so it cannot be shown to be "
            "the run this study makes; remove it from the study's reuse: to train it here"
        )
    return Reuse(family, regime, seed, source, kept)


def take(reuse: Reuse) -> dict:
    """Copy the kept run into this study's archive under this study's regime name; the summary
    says where it came from (`reused_from`)."""
    target = reuse.target
    target.mkdir(parents=True, exist_ok=True)
    for name in (STORE, "task.yaml"):
        shutil.copyfile(reuse.source / name, target / name)
    result = {**reuse.summary, "regime": reuse.regime, "reused_from": reuse.family.shown(reuse.source)}
    (target / "summary.json").write_text(json.dumps(result, indent=1) + "\n")  # last: it marks the run kept
    return result


def take_all(families: list[Family], seeds: list[int] | None, only: list[str] | None, extra: list[str]) -> list[dict]:
    """Every reusable run of these cells, all checked first (a ReuseError writes nothing), then copied."""
    found = [r for c in cells(families, seeds, only) if (r := check(c.family, c.regime, c.seed, extra)) is not None]
    return [take(r) for r in found]
