"""A study's tasks as families: each task's regimes (a task file plus overrides), seeds and folders,
read from a study file (mas_lab/study/spec.py). The paper's comparison at CPU scale (Table 1's
shape) is studies/paper.yaml; FAMILIES are its tasks."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository: tasks/, docs/, results/ (`make reproduce` runs there)
PAPER_STUDY = ROOT / "studies" / "paper.yaml"


@dataclass(frozen=True)
class Regime:
    """One row of the comparison: a task file (`{stem}` is the task's stem) and its overrides."""

    name: str
    task: str
    set: tuple[str, ...] = ()
    swap: bool = False  # the swap ablation after training (per-role policies)


@dataclass(frozen=True)
class Family:
    """One task of a study: its regimes, seeds, where its runs go (`out`, the work folder) and are
    kept (`archive`), and its section of the report."""

    key: str
    title: str
    stem: str
    out: str
    setting: str  # the settings in words, for the report
    archive: str = ""  # where finished runs are kept (default: <out>/archive)
    regime_list: tuple[Regime, ...] = ()
    untrained: tuple[tuple[str, str], ...] = ()  # report rows read from a regime's step-0 evaluation
    common: tuple[str, ...] = ()  # overrides of every run
    seeds: tuple[int, ...] = (0, 1, 2)
    study: str = ""  # the study's name
    study_file: str = ""
    study_out: str = ""  # the study folder: its MLflow store
    root: str = str(ROOT)  # where the runs start (relative task files resolve here)
    results_md: str = ""  # the Markdown file holding the task's section ("": none)
    images: str = ""  # the folder of the curves
    command: str = ""  # the command the report names ({key}: this task)
    heading: str = "The paper's comparison at CPU scale"  # the report section's heading, before the title
    reuse: tuple[tuple[str, str], ...] = ()  # regime -> another study's kept folder of it (mas_lab/study/reuse.py)

    @property
    def regimes(self) -> dict[str, tuple[str, list[str]]]:  # name -> (task file, overrides), in order
        return {r.name: (r.task.replace("{stem}", self.stem), list(r.set)) for r in self.regime_list}

    def shown(self, path: str | Path) -> str:
        """A path as the report names it: relative to where the study runs when inside it."""
        try:
            return str(Path(path).resolve().relative_to(Path(self.root).resolve()))
        except ValueError:
            return str(path)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.regime_list)

    @property
    def swapped(self) -> frozenset[str]:
        return frozenset(r.name for r in self.regime_list if r.swap)

    @property
    def begin(self) -> str:
        return f"<!-- reproduce:{self.key}:begin (written by mas_lab/study) -->"

    @property
    def end(self) -> str:
        return f"<!-- reproduce:{self.key}:end -->"

    @property
    def image(self) -> str:
        return f"reproduce_{self.key}.png"

    @property
    def archive_dir(self) -> Path:
        return Path(self.archive) if self.archive else Path(self.out) / "archive"

    @property
    def mlflow_store(self) -> Path:
        return Path(self.study_out or self.out) / "mlruns.db"


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-").replace("--", "-")


def archive_folder(archive: Path, name: str, seed: int) -> Path:
    """Where a regime's seed is kept in an archive folder."""
    return archive / slug(name) / f"seed-{seed}"


@dataclass(frozen=True)
class Cell:
    """One (task, regime, seed) of a study: its work folder and whether a finished run is kept."""

    family: Family
    regime: str
    seed: int

    @property
    def folder(self) -> Path:
        return Path(self.family.out) / slug(self.regime) / f"seed-{self.seed}"

    @property
    def kept(self) -> bool:
        return (archive_folder(self.family.archive_dir, self.regime, self.seed) / "summary.json").is_file()


def cells(families: list[Family], seeds: list[int] | None = None, only: list[str] | None = None) -> list[Cell]:
    """Seed by seed, and within a seed regime by regime across the tasks: the first complete tables
    come first, and two jobs run the same regime of two tasks side by side."""
    found = []
    for seed in sorted({s for f in families for s in (seeds or f.seeds)}):
        for name in dict.fromkeys(n for f in families for n in f.names):
            for family in families:
                if name in family.names and seed in (seeds or family.seeds) and (only is None or name in only):
                    found.append(Cell(family, name, seed))
    return found
