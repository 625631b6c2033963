import os
import sys
import tempfile
from pathlib import Path

import pytest

# One model cache per test session, so tests never depend on ~/.cache state.
os.environ.setdefault("MAS_LAB_CACHE", tempfile.mkdtemp(prefix="mas-lab-cache-"))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))


def load_benchmark(name: str):
    """A script of benchmarks/ as a module (registered, since dataclasses look their module up)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def wait_for(predicate, timeout=120, what="condition", interval=0.02):
    """Poll `predicate` until it returns something truthy (returned), or fail after `timeout` s."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def toy_task():
    from mas_lab.config import load_task

    return load_task(ROOT / "tasks" / "toy.yaml")
