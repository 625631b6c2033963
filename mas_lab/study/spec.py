"""Study files: tasks x regimes x seeds at one budget, and where the runs and the report go.

    name: paper-comparison
    out: sweeps                       # the study folder: its MLflow store (parent run + nested runs)
    seeds: [0, 1, 2]
    set: [train.eval_every=10]        # overrides for every run
    regimes:                          # in the report's order; {stem} is each task's stem
      - {name: single agent + GRPO, task: "tasks/{stem}_single_agent.yaml"}
      - {name: MAS + trajectory GRPO, task: "tasks/{stem}.yaml", set: [algorithm.mode=trajectories]}
      - {name: MAS + AT-GRPO per-role LoRA, task: "tasks/{stem}_per_role_lora.yaml", swap: true}
    untrained: {single agent (before RL): single agent + GRPO}
    tasks:
      - {key: plan_path, stem: plan_path_learns, title: ..., setting: ..., out: ..., archive: ...,
         reuse: {MAS + AT-GRPO shared: results/other/plan_path/mas--at-grpo-shared},  # mas_lab/study/reuse.py
         set: {MAS + trajectory GRPO: [algorithm.k=8]}}  # a regime's overrides on this task only
    report: {results_md: docs/results/paper.md, images: docs/images}

Paths are relative to the folder `mas-lab study` runs in. A wrong file raises StudyFileError naming
the file, the field and what is allowed, before anything is written.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, field_validator, model_validator

from mas_lab.config import TaskFileError, load_task, read_yaml_file
from mas_lab.study.families import PAPER_STUDY, ROOT, Family, Regime

KEY = r"^[a-z0-9][a-z0-9_-]*$"


class StudyFileError(ValueError):
    """A study file that cannot run; the message names the file and the field."""


class DamagedStudyFile(ValueError):
    """A file a study keeps (summary.json, segments.json, state) that does not parse; the message
    names it and what to do."""


def read_kept_json(path: Path):
    """A study's kept JSON file, or DamagedStudyFile naming it (a garbage summary.json once ended
    `study status`, `--report-only` and `compare` in a JSONDecodeError traceback)."""
    try:
        return json.loads(Path(path).read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise DamagedStudyFile(
            f"{path}: damaged, not JSON ({exc}); move it aside (the cell is then run again) or restore it"
        ) from None


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RegimeSpec(_Strict):
    name: str = Field(min_length=1, max_length=80, description="the regime's row in the report")
    task: str = Field(min_length=1, description="its task file; {stem} is replaced by each task's stem")
    set: list[str] = Field([], description="overrides of this regime (key.path=value)")
    swap: bool = Field(False, description="after training, the swap ablation (per-role policies only)")
    tasks: list[str] = Field(
        [],
        max_length=100,
        description="the keys of the tasks this regime runs on (default: every task); e.g. a single agent "
        "with the tool only where the task has a tool",
    )


class TaskSpec(_Strict):
    key: str = Field(
        pattern=KEY, max_length=80, description="the task's name in the study (lower case, digits, _ and -)"
    )
    stem: str = Field(pattern=KEY, max_length=80, description="what {stem} becomes in the regimes' task files")
    title: str = Field("", max_length=500, description="the report's heading")
    setting: str = Field("", max_length=2000, description="the settings in words, for the report")
    out: str = Field("", description="the work folder of its runs (default: <study out>/<key>)")
    archive: str = Field("", description="where finished runs are kept (default: <work folder>/archive)")
    set: dict[str, list[str]] = Field(
        {},
        description="regime name -> overrides of that regime on this task only, after the regime's own (e.g. a "
        "trajectory regime's K where the task's team gives one role its own K)",
    )
    reuse: dict[str, str] = Field(
        {},
        description="regime name -> another study's kept folder of the same run (its seed-<n> folders): a seed kept "
        "there with the same resolved task is copied instead of trained again; a different one is refused",
    )


class ReportSpec(_Strict):
    results_md: str | None = Field(None, description="a Markdown file to write each task's section into")
    images: str | None = Field(None, description="the folder of the curves (default: <study out>/images)")
    command: str = Field("", description="the command the report names (default: mas-lab study FILE)")
    heading: str = Field(
        "The paper's comparison at CPU scale", min_length=1, description="each task section's heading, before its title"
    )


class StudySpec(_Strict):
    name: str = Field(pattern=KEY, max_length=80, description="the study's name (its MLflow parent run)")
    description: str = Field("", max_length=5000)
    out: str = Field("", description="the study folder (default: studies/<name> under the working folder)")
    seeds: list[StrictInt] = Field([0, 1, 2], min_length=1, max_length=1000)
    set: list[str] = Field([], description="overrides of every run")
    regimes: list[RegimeSpec] = Field(min_length=1)
    untrained: dict[str, str] = Field(
        {}, description="report rows read from a regime's step-0 evaluation: row name -> regime name"
    )
    tasks: list[TaskSpec] = Field(min_length=1)
    report: ReportSpec = ReportSpec()

    @field_validator("set")
    @classmethod
    def _overrides(cls, items: list[str]) -> list[str]:
        return _check_overrides(items)

    @model_validator(mode="after")
    def _consistent(self) -> StudySpec:
        names = [r.name for r in self.regimes]
        if len(set(names)) != len(names):
            raise ValueError(f"regimes: names repeat ({sorted({n for n in names if names.count(n) > 1})})")
        keys = [t.key for t in self.tasks]
        if len(set(keys)) != len(keys):
            raise ValueError(f"tasks: keys repeat ({sorted({k for k in keys if keys.count(k) > 1})})")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError("seeds: a seed repeats")
        for row, source in self.untrained.items():
            if source not in names:
                raise ValueError(f"untrained.{row}: '{source}' is not a regime; allowed: {names}")
        for regime in self.regimes:
            _check_overrides(regime.set)
        for i, task in enumerate(self.tasks):
            for name in task.reuse:
                if name not in names:
                    raise ValueError(f"tasks.{i}.reuse: '{name}' is not a regime; allowed: {names}")
            for name, items in task.set.items():
                if name not in names:
                    raise ValueError(f"tasks.{i}.set: '{name}' is not a regime; allowed: {names}")
                _check_overrides(items)
        return self


def _check_overrides(items: list[str]) -> list[str]:
    for item in items:
        if not re.match(r"^[A-Za-z_][\w.]*=", item):
            raise ValueError(f"'{item}': expected key.path=value")
    return items


def load_study(path: str | Path, root: Path | None = None) -> list[Family]:
    """The study's tasks as families (each with its regimes, seeds and folders), every task file
    checked to exist and to load with its overrides; or StudyFileError."""
    path = Path(path)
    root = (root or Path.cwd()).resolve()
    if not path.is_file():
        raise StudyFileError(f"{path}: no such study file")
    try:
        data = read_yaml_file(path, "study file")
    except ValueError as exc:
        raise StudyFileError(str(exc)) from None
    if not isinstance(data, dict):
        raise StudyFileError(f"{path}: expected a mapping (name, regimes, tasks, ...)")
    try:
        spec = StudySpec.model_validate(data)
    except ValidationError as exc:
        raise StudyFileError(f"{path}: " + "; ".join(_describe(e) for e in exc.errors())) from None
    out = _path(root, spec.out or f"studies/{spec.name}")
    if spec.report.results_md and _path(root, spec.report.results_md).is_dir():
        raise StudyFileError(f"{path}: report.results_md: {spec.report.results_md} is a folder, not a Markdown file")
    keys = [task.key for task in spec.tasks]
    for r_index, regime in enumerate(spec.regimes):
        unknown = [key for key in regime.tasks if key not in keys]
        if unknown:
            raise StudyFileError(
                f"{path}: regimes[{r_index}] ({regime.name}).tasks: {unknown} are not tasks; allowed: {keys}"
            )
    families = []
    for t_index, task in enumerate(spec.tasks):
        regimes = []
        for r_index, regime in enumerate(spec.regimes):
            if regime.tasks and task.key not in regime.tasks:
                continue
            task_file = regime.task.replace("{stem}", task.stem)
            where = f"tasks[{t_index}] ({task.key}) x regimes[{r_index}] ({regime.name})"
            overrides = (*regime.set, *task.set.get(regime.name, []))
            try:
                load_task(root / task_file, [*spec.set, *overrides])
            except TaskFileError as exc:
                raise StudyFileError(f"{path}: {where}: {exc}") from None
            regimes.append(Regime(regime.name, _relative(root, regime.task), overrides, regime.swap))
        work = _path(root, task.out) if task.out else out / task.key
        for name, folder in task.reuse.items():
            if not _path(root, folder).is_dir():
                raise StudyFileError(f"{path}: tasks[{t_index}] ({task.key}).reuse.{name}: no such folder {folder}")
        families.append(
            Family(
                key=task.key,
                title=task.title or task.key,
                stem=task.stem,
                out=str(work),
                setting=task.setting,
                archive=str(_path(root, task.archive)) if task.archive else "",
                regime_list=tuple(regimes),
                untrained=tuple(spec.untrained.items()),
                common=tuple(spec.set),
                seeds=tuple(spec.seeds),
                study=spec.name,
                study_file=_relative(root, str(path.resolve())),
                study_out=str(out),
                root=str(root),
                results_md=str(_path(root, spec.report.results_md)) if spec.report.results_md else "",
                images=str(_path(root, spec.report.images)) if spec.report.images else str(out / "images"),
                command=spec.report.command,
                heading=spec.report.heading,
                reuse=tuple((name, str(_path(root, folder))) for name, folder in task.reuse.items()),
            )
        )
    return families


def _path(root: Path, value: str) -> Path:
    return (root / value).resolve()


def _relative(root: Path, value: str) -> str:
    """A path inside the root as written relative to it (kept summaries stay portable), else absolute."""
    full = (root / value).resolve()
    try:
        return str(full.relative_to(root))
    except ValueError:
        return str(full)


def _describe(error: Any) -> str:
    where = ".".join(str(p) for p in error["loc"])
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        sections: dict[tuple[str, ...], type[BaseModel]] = {
            (): StudySpec,
            ("regimes",): RegimeSpec,
            ("tasks",): TaskSpec,
            ("report",): ReportSpec,
        }
        fields = sections.get(tuple(p for p in error["loc"][:-1] if isinstance(p, str)))
        if fields is not None:
            message += f"; allowed: {sorted(fields.model_fields)}"
    return f"{where}: {message}" if where else message  # a check of the whole file names its field itself


def paper_families() -> dict[str, Family]:
    """The tasks of studies/paper.yaml, by key."""
    return {f.key: f for f in load_study(PAPER_STUDY, ROOT)}
