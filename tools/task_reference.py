"""Write the task-file reference of docs/task-files.md from the schema itself: every key of every section
(from the Field descriptions in mas_lab/config.py) and every environment's roles and parameters
(from each environment's Params model). `--check` exits 1 when it is out of date.

    python tools/task_reference.py          # rewrite the reference in docs/task-files.md
    python tools/task_reference.py --check  # is it current? (a test runs this)
"""

from __future__ import annotations

import sys
import typing
from pathlib import Path

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "docs" / "task-files.md"
BEGIN, END = "<!-- task-reference: begin (tools/task_reference.py) -->", "<!-- task-reference: end -->"


def _model_of(annotation) -> type[BaseModel] | None:
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _default(field) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "—"
    value = field.default_factory() if field.default_factory is not None else field.default
    if isinstance(value, BaseModel):
        return ""
    if value is None:
        return "none"
    if isinstance(value, str):
        return f"`{value}`"
    return f"`{value}`".replace("'", "")


def _choices(annotation) -> str:
    for candidate in (annotation, *typing.get_args(annotation)):
        if typing.get_origin(candidate) is typing.Literal:
            return " One of " + ", ".join(f"`{v}`" for v in typing.get_args(candidate)) + "."
    return ""


def _rows(model: type[BaseModel], prefix: str) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        annotation = field.annotation
        origin = typing.get_origin(annotation)
        nested = _model_of(annotation)
        if origin is list and nested is not None:
            rows.append(f"| `{key}[]` | — | {field.description} |")
            rows += _rows(nested, f"{key}[].")
        elif origin is dict and nested is not None:
            rows.append(f"| `{key}.<name>` | — | {field.description} |")
            rows += _rows(nested, f"{key}.<name>.")
        elif nested is not None and name != "params":
            section = nested.__doc__.strip().splitlines()[0] if nested.__doc__ else field.description
            if key.count(".") == 0 or typing.get_origin(annotation) is typing.Union:
                rows.append(
                    f"| `{key}` | {_default(field) or 'none' if origin is typing.Union else '—'} | "
                    f"{field.description or section} |"
                )
            rows += _rows(nested, f"{key}.")
        else:
            text, choices = field.description or "", _choices(annotation)
            if choices:
                text = text.rstrip(".") + "." + choices
            rows.append(f"| `{key}` | {_default(field)} | {text} |")
    return rows


def _env_rows() -> list[str]:
    from mas_lab.envs import ENVS

    rows = ["| env | roles (turn order) | params: key (default) meaning |", "|---|---|---|"]
    for name, env in ENVS.items():
        order = "parallel" if env.parallel else "sequential"
        params = "; ".join(
            f"`{key}` ({_default(field).strip('`') or 'none'}) {field.description}"
            for key, field in env.Params.model_fields.items()
        )
        rows.append(f"| `{name}` | {', '.join(env.roles)} ({order}) | {params} |")
    return rows


def reference() -> str:
    from mas_lab.config import TaskConfig

    lines = [
        BEGIN,
        "| key | default | meaning |",
        "|---|---|---|",
        *_rows(TaskConfig, ""),
        "",
        "Environments (`env.name`), their roles, and `env.params` (unknown or ill-typed parameters are "
        "task-file errors):",
        "",
        *_env_rows(),
        END,
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    text = README.read_text()
    if BEGIN not in text or END not in text:
        print(f"{README}: no task-reference markers", file=sys.stderr)
        return 1
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    updated = head + reference() + tail
    if "--check" in argv:
        if updated != text:
            print("docs/task-files.md's reference is out of date: run python tools/task_reference.py", file=sys.stderr)
            return 1
        return 0
    README.write_text(updated)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main(sys.argv[1:]))
