"""Environment registry: task-file `env.name` -> Env class.

The built-in environments, and those other packages register under the entry-point group
`mas_lab.envs` (`name = "package.module:EnvClass"` in their pyproject.toml), discovered on first
use. A plugin that fails to load is reported by name (`mas-lab envs`, and a task that names it),
never hiding the others. docs/new-task.md walks through writing one.
"""

from __future__ import annotations

import importlib.metadata
import signal
import threading
from typing import Iterator

from mas_lab.envs.base import ActionResult, Env, EnvParams, Problem, ProblemPool
from mas_lab.envs.code_task import CodeEnv
from mas_lab.envs.math_task import MathEnv
from mas_lab.envs.plan_path import PlanPathEnv
from mas_lab.envs.reasoning_gym import ReasoningGymEnv
from mas_lab.envs.sokoban import SokobanEnv
from mas_lab.envs.sudoku import SudokuEnv
from mas_lab.envs.toy import ToyEnv

ENTRY_POINTS = "mas_lab.envs"


PLUGIN_IMPORT_S = 10.0  # a plugin's import that takes longer is reported as failed (main thread only)


class PluginTimeout(Exception):
    """A plugin's import did not finish in time."""


def _load_within(point, seconds: float):
    """`point.load()`, given up after `seconds` where a timer can interrupt it (the main thread: a
    plugin that sleeps or loops at import must not hang `mas-lab envs` or a run's start)."""
    if threading.current_thread() is not threading.main_thread():
        return point.load()

    def expire(signum, frame):
        raise PluginTimeout(f"its import did not finish in {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return point.load()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class Registry(dict):
    """name -> Env class: the built-ins, then the plugins of the entry-point group, loaded once."""

    def __init__(self, builtins: dict[str, type[Env]]):
        super().__init__(builtins)
        self.builtin = set(builtins)
        self.plugins: dict[str, str] = {}  # plugin name -> where it came from ("module:Class (distribution)")
        self.failed: dict[str, str] = {}  # plugin name -> why it did not load
        self._discovered = False

    def discover(self) -> None:
        if self._discovered:
            return
        self._discovered = True

        for point in importlib.metadata.entry_points(group=ENTRY_POINTS):
            where = f"{point.value} ({point.dist.name if point.dist else 'unknown distribution'})"
            if point.name in self.builtin:
                self.failed[point.name] = f"{where}: the name of a built-in environment"
                continue
            try:
                loaded = _load_within(point, PLUGIN_IMPORT_S)
            except (Exception, SystemExit) as exc:  # a broken plugin is reported, never hides the others
                said = f"exit({exc.code})" if isinstance(exc, SystemExit) else f"{type(exc).__name__}: {exc}"
                self.failed[point.name] = f"{where}: {said}"
                continue
            if not (isinstance(loaded, type) and issubclass(loaded, Env)):
                self.failed[point.name] = f"{where}: not a subclass of mas_lab.envs.Env"
                continue
            dict.__setitem__(self, point.name, loaded)
            self.plugins[point.name] = where

    def __getitem__(self, name: str) -> type[Env]:
        self.discover()
        return dict.__getitem__(self, name)

    def __contains__(self, name: object) -> bool:
        self.discover()
        return dict.__contains__(self, name)

    def __iter__(self) -> Iterator[str]:
        self.discover()
        return dict.__iter__(self)

    def __len__(self) -> int:
        self.discover()
        return dict.__len__(self)

    def keys(self):  # type: ignore[override]
        self.discover()
        return dict.keys(self)

    def items(self):  # type: ignore[override]
        self.discover()
        return dict.items(self)

    def values(self):  # type: ignore[override]
        self.discover()
        return dict.values(self)


ENVS: Registry = Registry(
    {
        "toy": ToyEnv,
        "plan_path": PlanPathEnv,
        "sokoban": SokobanEnv,
        "sudoku": SudokuEnv,
        "math": MathEnv,
        "code": CodeEnv,
        "reasoning_gym": ReasoningGymEnv,
    }
)

__all__ = [
    "ENVS",
    "Env",
    "EnvParams",
    "Problem",
    "ProblemPool",
    "ActionResult",
    "PlanPathEnv",
    "SokobanEnv",
    "SudokuEnv",
    "ToyEnv",
    "MathEnv",
    "CodeEnv",
    "ReasoningGymEnv",
]
