"""The layout is the architecture (issue 52): no import cycle among the product's modules, counting
every import (module level, inside functions, under TYPE_CHECKING), and the core never imports the
dashboard's toolkit."""

import ast
from pathlib import Path

from conftest import ROOT

PACKAGES = ("mas_lab", "tui")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the first-party modules it imports anywhere in its source (a name imported from a
    package counts as its submodule when there is one)."""
    modules = _modules()

    def owner(target: str) -> str | None:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        return target or None

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            else:
                continue
            for target in targets:
                found = owner(target)
                # a package's __init__ importing its own submodules (re-exports) is not a cycle edge
                if found and found != name and not (path.name == "__init__.py" and found.startswith(name + ".")):
                    graph[name].add(found)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of two or more modules (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_the_products_modules():
    assert cycles(import_graph()) == []


def test_the_core_never_imports_textual():
    """Only the command line (mas_lab/cli.py, which opens the dashboard) may import it."""
    for name, path in _modules().items():
        if name.startswith("mas_lab") and name != "mas_lab.cli":
            tree = ast.parse(path.read_text())
            imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
            imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
            assert not any(m.split(".")[0] in ("textual", "tui") for m in imported), name


def test_evaluation_metric_names_are_defined_once():
    """The evaluation's metric keys live in training/metric_names.py; every reader (the summary,
    compare, the charts, the study, the notebook, the dashboard) imports them. A string that starts
    with "eval/" anywhere else in the code (docstrings aside) would be a second definition."""
    import io
    import tokenize

    found = []
    for name, path in _modules().items():
        if name == "mas_lab.training.metric_names":
            continue
        tokens = list(tokenize.generate_tokens(io.StringIO(path.read_text()).readline))
        for i, token in enumerate(tokens):
            if token.type != tokenize.STRING:
                continue
            body = token.string.lstrip("rbfRBF").strip("\"'")
            docstring = i > 0 and tokens[i - 1].type in (tokenize.INDENT, tokenize.NEWLINE, tokenize.NL)
            if body.startswith("eval/") and not docstring:
                found.append(f"{path.relative_to(ROOT)}:{token.start[0]}")
    assert found == []


def test_no_sql_outside_the_store():
    """The run store owns its SQL: no other module connects to SQLite or runs a statement."""
    for name, path in _modules().items():
        if name == "mas_lab.records.store":
            continue
        text = path.read_text()
        assert "sqlite3.connect" not in text and ".execute(" not in text.replace("trial.execute(", ""), name


def test_the_command_line_is_arguments_and_printing():
    """No function of cli.py over 60 lines: what a command does lives in the core."""
    tree = ast.parse((ROOT / "mas_lab" / "cli.py").read_text())
    long = [
        (node.name, node.end_lineno - node.lineno + 1)
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 60
    ]
    assert long == []


def test_a_function_local_import_says_what_start_up_it_buys():
    """An import inside a function is there only to keep a heavy module (torch, ray, mlflow, ...)
    out of start-up; a `# lazy: ...` comment above it (or above its block of imports) says which.
    Any other import belongs at the top of its module."""
    unmarked = []
    for path in _modules().values():
        lines = path.read_text().splitlines()
        for fn in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    row = node.lineno - 2  # the line above, climbing over the block's earlier imports
                    while row >= 0 and lines[row].strip().startswith(("import ", "from ")):
                        row -= 1
                    if not lines[row].strip().startswith("# lazy: "):
                        unmarked.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert unmarked == []
