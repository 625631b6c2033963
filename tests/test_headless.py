"""The core never imports textual (the dashboard is imported only inside the CLI commands that
open it), checked by importing every core module in a fresh interpreter."""

import subprocess
import sys

from conftest import ROOT

CORE = sorted(
    ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
    for p in (ROOT / "mas_lab").rglob("*.py")
)


def test_importing_every_core_module_loads_no_textual():
    code = (
        "import importlib, sys\n"
        f"for name in {CORE!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m == 'textual' or m.startswith(('textual.', 'tui'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert len(CORE) > 20 and "mas_lab.cli" in CORE and "mas_lab.runs" in CORE
    assert out.stdout.strip() == "[]"


def test_the_cli_starts_without_torch():
    """`mas-lab` loads torch and transformers only in the commands that build a model: every other
    command (status, report, study --report-only, --help) starts without them, and a run under an
    address-space limit fails where torch loads, as its one-line "ran out of memory" (a report
    module that imported the evaluation pulled torch into every command)."""
    code = (
        "import sys, mas_lab.cli\n"
        "print(sorted(m for m in ('torch', 'transformers', 'ray', 'vllm') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_the_fake_backend_implements_the_backend_interface():
    from fakes import FakeBackend, FakeEngine

    from mas_lab.actors.backend import Backend, PolicyBackend

    assert isinstance(FakeBackend(FakeEngine()), PolicyBackend)
    assert all(
        callable(getattr(Backend, name))
        for name in (
            "generate",
            "update",
            "sync_weights",
            "save_policies",
            "load_policies",
            "placement",
            "alive",
            "shutdown",
        )
    )


def test_a_failed_runs_one_line_needs_no_numpy():
    """The line a run's failure prints says whether a checkpoint exists (cli._again); listing the
    checkpoints must not load numpy: under the address-space limit that failed torch's import,
    numpy's libraries failed to map too, and the MemoryError raised while writing the line became a
    traceback (CI, test_an_address_space_limit_too_small_for_torch_fails_the_run_in_one_line)."""
    code = (
        "import sys, tempfile, pathlib\n"
        "from mas_lab.records import checkpoint\n"
        "print(checkpoint.complete(pathlib.Path(tempfile.mkdtemp())), 'numpy' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[] False"
