"""docs/task-files.md (the task-file reference) is generated from the schema (tools/task_reference.py) and
must be current; every field of every section has a description."""

import subprocess
import sys
import typing

from conftest import ROOT
from pydantic import BaseModel


def test_the_task_file_reference_is_current():
    proc = subprocess.run(
        [sys.executable, "tools/task_reference.py", "--check"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr


def test_every_task_field_and_env_parameter_is_described():
    from mas_lab.config import TaskConfig
    from mas_lab.envs import ENVS

    missing, seen = [], set()

    def walk(model: type[BaseModel], prefix: str) -> None:
        if model in seen:
            return
        seen.add(model)
        for name, field in model.model_fields.items():
            if not field.description:
                missing.append(prefix + name)
            for arg in (field.annotation, *typing.get_args(field.annotation)):
                for inner in (arg, *typing.get_args(arg)):
                    if isinstance(inner, type) and issubclass(inner, BaseModel):
                        walk(inner, f"{prefix}{name}.")

    walk(TaskConfig, "")
    for name, env in ENVS.items():
        walk(env.Params, f"env.params[{name}].")
    assert missing == []
