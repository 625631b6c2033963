"""Environment registry: task-file `env.name` -> Env class."""
from mas_lab.envs.base import ActionResult, Env, EnvParams, Problem, ProblemPool
from mas_lab.envs.code_task import CodeEnv
from mas_lab.envs.math_task import MathEnv
from mas_lab.envs.plan_path import PlanPathEnv
from mas_lab.envs.sokoban import SokobanEnv
from mas_lab.envs.sudoku import SudokuEnv
from mas_lab.envs.toy import ToyEnv

ENVS: dict[str, type[Env]] = {"toy": ToyEnv, "plan_path": PlanPathEnv, "sokoban": SokobanEnv, "sudoku": SudokuEnv, "math": MathEnv, "code": CodeEnv}

__all__ = ["ENVS", "Env", "EnvParams", "Problem", "ProblemPool", "ActionResult", "PlanPathEnv", "SokobanEnv", "SudokuEnv", "ToyEnv", "MathEnv", "CodeEnv"]
