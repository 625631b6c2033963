"""Judging code by tests where the code under test cannot forge the verdict.

Running a solution and its tests in one process lets the solution decide the verdict: it can print
the harness's result line and exit, redefine `exec` or `AssertionError`, or read the expected
values out of the program text. So the judge runs two sandboxes:

- the *server* holds the implementation (and the task's setup code) and answers calls: a function
  name and literal arguments in, a literal value (or the exception's name) out;
- the *tester* holds the tests (and the setup), with every function of the implementation replaced
  by a stub that calls the server, and reports which tests completed.

The host relays one JSON line per call between them. The implementation never sees a test or an
expected value, only the arguments it is called with; values cross as Python literals parsed with
`ast.literal_eval` in the tester's sandbox (no code runs in the parse). A server that lies can only
answer wrongly. For untrusted tests (the tester role) the tests themselves are the tester program:
they decide "completed", so the reward also requires that they fail against trivially wrong
implementations (`MUTANTS`) and against the reference with every answer changed (`PERTURBED`):
a test that passes everything, or checks only a type or "not None", earns nothing.
"""

from __future__ import annotations

import ast
import builtins
import json
import os
import select
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from mas_lab.sandbox.isolation import Limits, spawned

_CODEC = """
import math as _math
def _encode(v):
    if isinstance(v, float) and not _math.isfinite(v):
        return ("__mas_lab_float__", repr(v))
    if isinstance(v, (set, frozenset)):
        return ("__mas_lab_" + type(v).__name__ + "__", tuple(_encode(x) for x in v))
    if isinstance(v, (list, tuple)):
        return type(v)(_encode(x) for x in v)
    if isinstance(v, dict):
        return {_encode(k): _encode(x) for k, x in v.items()}
    if v is None or isinstance(v, (bool, int, float, complex, str, bytes)):
        return v
    raise TypeError(f"not a literal value: {type(v).__name__}")
def _decode(v):
    if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str) and v[0].startswith("__mas_lab_"):
        tag, inner = v
        if tag == "__mas_lab_float__":
            return float(inner)
        items = [_decode(x) for x in inner]
        return set(items) if tag == "__mas_lab_set__" else frozenset(items)
    if isinstance(v, (list, tuple)):
        return type(v)(_decode(x) for x in v)
    if isinstance(v, dict):
        return {_decode(k): _decode(x) for k, x in v.items()}
    return v
"""

_SERVER = """
import ast as _ast, json as _json, os as _os, sys as _sys
_requests = _os.fdopen(_os.dup(0), "r")
_replies = _os.fdopen(_os.dup(1), "w")
_sys.stdin = open(_os.devnull)
_sys.stdout = _sys.stderr
{setup}
{implementation}
for _line in _requests:
    _request = _json.loads(_line)
    try:
        _args, _kwargs = _decode(_ast.literal_eval(_request["args"])), _decode(_ast.literal_eval(_request["kwargs"]))
        _reply = {{"id": _request["id"], "ok": True, "value": repr(_encode(globals()[_request["name"]](*_args, **_kwargs)))}}
    except BaseException as _error:
        _reply = {{"id": _request["id"], "ok": False, "error": type(_error).__name__}}
    _replies.write(_json.dumps(_reply) + "\\n")
    _replies.flush()
"""

_TESTER = """
import ast as _ast, json as _json, os as _os, sys as _sys
_requests = _os.fdopen(_os.dup(1), "w")
_replies = _os.fdopen(_os.dup(0), "r")
_sys.stdin = open(_os.devnull)
_sys.stdout = _sys.stderr
_calls = [0]
def _remote(_name):
    def call(*args, **kwargs):
        _calls[0] += 1
        _requests.write(_json.dumps({{"id": _calls[0], "name": _name, "args": repr(_encode(args)),
                                     "kwargs": repr(_encode(kwargs))}}) + "\\n")
        _requests.flush()
        reply = _json.loads(_replies.readline())
        if not reply.get("ok"):
            raise RuntimeError("the implementation raised " + str(reply.get("error")))
        return _decode(_ast.literal_eval(reply["value"]))
    call.__name__ = _name
    return call
{setup}
for _name in {names!r}:
    globals()[_name] = _remote(_name)
_results = []
for _test in {tests!r}:
    _before = _calls[0]
    try:
        exec(_test, dict(globals()))
        _results.append([True, _calls[0] > _before])
    except BaseException:
        _results.append([False, _calls[0] > _before])
_requests.write(_json.dumps({{"verdict": _results}}) + "\\n")
_requests.flush()
"""

# Trivially wrong implementations a meaningful test must reject (for the tester's reward).
MUTANTS = (
    "def {name}(*args, **kwargs):\n    return None\n",
    "def {name}(*args, **kwargs):\n    return 0\n",
    "def {name}(*args, **kwargs):\n    return ''\n",
    "def {name}(*args, **kwargs):\n    return []\n",
    "def {name}(*args, **kwargs):\n    return args[0] if args else None\n",
    "def {name}(*args, **kwargs):\n    raise ValueError('not implemented')\n",
)
# The reference with every answer changed, in three ways a test must each reject: it then checks
# the actual value. With one fixed change (append None, append '#') a test that checks no value
# could tell the change apart ("assert None not in f(x)", "assert not f(x).endswith('#')"); each
# way here changes the answer with its own elements (grow by repeating one, shrink, or change one),
# so only a test that knows the answer rejects all three.
PERTURBED = """{reference}
def _mas_lab_perturb(v, way):
    if isinstance(v, bool):
        return not v
    if isinstance(v, (int, float, complex)):
        return v + (1, -1, 2)[way]
    if isinstance(v, (str, bytes)):
        unit = v[-1:] or (b"a" if isinstance(v, bytes) else "a")
        if way == 0:
            return v + unit
        if not v:
            return unit
        if way == 1:
            return v[:-1]
        return v[:-1] + (bytes([v[-1] ^ 1]) if isinstance(v, bytes) else chr(ord(v[-1]) ^ 1))
    if isinstance(v, (list, tuple)):
        items = list(v)
        if way == 0:
            items = items + items[-1:] if items else [0]
        elif way == 1:
            items = items[:-1] if items else [0]
        else:
            items = items[:-1] + [_mas_lab_perturb(items[-1], 0)] if items else [0]
        return type(v)(items)
    if isinstance(v, (set, frozenset)):
        items = set(v)
        if way == 1 and items:
            items.discard(next(iter(items)))
        else:
            items.add(max((x for x in items if isinstance(x, int) and not isinstance(x, bool)), default=0) + 1)
        return type(v)(items)
    if isinstance(v, dict):
        items = dict(v)
        if way == 1 and items:
            items.pop(next(iter(items)))
        elif items:
            key = next(iter(items))
            items[key] = _mas_lab_perturb(items[key], 0)
        else:
            items[0] = 0
        return items
    return 0 if v is None else None
"""
PERTURBATIONS = 3
PERTURBED_FUNCTION = """_mas_lab_reference_{name} = {name}
def {name}(*args, **kwargs):
    return _mas_lab_perturb(_mas_lab_reference_{name}(*args, **kwargs), {way})
"""
MAX_LINE = 1 << 20


@dataclass
class Verdict:
    """Per test: whether it completed, and whether it called the implementation at all."""

    passed: list[bool]
    exercised: list[bool]
    status: str  # ok | timeout | error (no verdict came back: every test counts as failed)

    @property
    def rate(self) -> float:
        return sum(self.passed) / len(self.passed) if self.passed else 0.0


def _tree(code: str) -> ast.Module:
    try:
        with warnings.catch_warnings():  # model code is full of invalid escape sequences
            warnings.simplefilter("ignore")
            return ast.parse(code)
    except (SyntaxError, ValueError):
        return ast.Module(body=[], type_ignores=[])


def functions(code: str) -> list[str]:
    """Top-level function names of `code`."""
    return [n.name for n in _tree(code).body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def served_names(implementation: str, tests: list[str], setup: str = "", expected: tuple[str, ...] = ()) -> list[str]:
    """The implementation's top-level functions that the tests call by name: these become stubs in
    the tester. Never a name the setup or the tests define themselves, nor a builtin unless the task
    asks for it (`expected`: the reference solution's functions, e.g. MBPP's `sum`), so a solution
    that defines `abs` or `isinstance` cannot answer for the tests' own checks."""
    defined = functions(implementation)
    used: set[str] = set()
    bound = set(dir(builtins)) - set(expected)
    for code in [*tests, setup]:
        for node in ast.walk(_tree(code)):
            if isinstance(node, ast.Name):
                (used if isinstance(node.ctx, ast.Load) else bound).add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound.add(node.name)
            elif isinstance(node, ast.arg):
                bound.add(node.arg)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                bound.update((a.asname or a.name).split(".")[0] for a in node.names)
    for node in ast.walk(_tree(setup)):
        if isinstance(node, ast.Name):
            bound.add(node.id)
    return [name for name in dict.fromkeys(defined) if name in used and name not in bound]


def judge(tests: list[str], implementation: str, names: list[str], setup: str = "", wall_s: float = 10.0) -> Verdict:
    """Run `tests` against `implementation` in two sandboxes (module docstring); never raises."""
    failed = Verdict([False] * len(tests), [False] * len(tests), "error")
    if not tests:
        return Verdict([], [], "ok")
    limits = Limits(wall_s=wall_s, cpu_s=int(wall_s) + 1, output_chars=4096)
    server_code = _CODEC + _SERVER.format(setup=setup, implementation=implementation)
    tester_code = _CODEC + _TESTER.format(setup=setup, names=list(names), tests=list(tests))
    deadline = time.monotonic() + wall_s
    try:
        with spawned(server_code, limits) as server, spawned(tester_code, limits) as tester:
            for proc in (server, tester):  # prints go to stderr: drain it, or a chatty program blocks
                threading.Thread(target=_discard, args=(proc.stderr,), daemon=True).start()
            assert server.stdout is not None and tester.stdout is not None and tester.stdin is not None  # piped
            server_lines, tester_lines = _Lines(server.stdout.fileno()), _Lines(tester.stdout.fileno())
            while True:
                line = tester_lines.next(deadline)
                if line is None:
                    return Verdict(
                        failed.passed, failed.exercised, "timeout" if time.monotonic() >= deadline else "error"
                    )
                message = _json(line)
                if "verdict" in message:
                    results = message["verdict"]
                    if not (isinstance(results, list) and len(results) == len(tests)):
                        return failed
                    return Verdict([r[0] is True for r in results], [r[1] is True for r in results], "ok")
                reply = _relay(message, line, server, server_lines, deadline)
                tester.stdin.write(reply)
                tester.stdin.flush()
    except (OSError, ValueError):
        return failed


def judge_apart(
    tests: list[str], implementation: str, names: list[str], setup: str = "", wall_s: float = 10.0
) -> Verdict:
    """`judge`, each test in a tester process of its own. Untrusted tests (the tester role's) run
    in the tester program: one of them could write the verdict line for its whole batch and exit,
    so that three tests that check nothing passed as meaningful with it. Alone, a test can only
    speak for itself. The pairs of processes run a few at a time."""
    if not tests:
        return Verdict([], [], "ok")
    with ThreadPoolExecutor(max_workers=min(4, len(tests))) as pool:
        verdicts = list(pool.map(lambda test: judge([test], implementation, names, setup, wall_s), tests))
    statuses = {v.status for v in verdicts}
    return Verdict(
        [v.passed[0] for v in verdicts],
        [v.exercised[0] for v in verdicts],
        "ok" if statuses == {"ok"} else "timeout" if "timeout" in statuses else "error",
    )


def _discard(stream) -> None:
    try:
        while stream.read1(65536):
            pass
    except (OSError, ValueError):
        pass


def _relay(message: dict, line: bytes, server, server_lines: "_Lines", deadline: float) -> bytes:
    """Send one call to the server; its reply with the same id, or an error reply."""
    request_id = message.get("id")
    error = json.dumps({"id": request_id, "ok": False, "error": "no answer"}).encode() + b"\n"
    try:
        server.stdin.write(line)
        server.stdin.flush()
    except OSError:
        return error
    while True:
        reply = server_lines.next(deadline)
        if reply is None:
            return error
        if _json(reply).get("id") == request_id:
            return reply


def _json(line: bytes) -> dict:
    try:
        value = json.loads(line)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class _Lines:
    """Complete lines from a pipe, waiting at most until a deadline; lines over MAX_LINE end it."""

    def __init__(self, fd: int):
        self.fd, self.buffer, self.closed = fd, b"", False

    def next(self, deadline: float) -> bytes | None:
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if self.closed or remaining <= 0 or len(self.buffer) > MAX_LINE:
                return None
            ready, _, _ = select.select([self.fd], [], [], remaining)
            if not ready:
                return None
            block = os.read(self.fd, 65536)
            if not block:
                self.closed = True
                continue
            self.buffer += block
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line + b"\n"
