import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

# One model cache per test session, so tests never depend on ~/.cache state.
os.environ.setdefault("MAS_LAB_CACHE", tempfile.mkdtemp(prefix="mas-lab-cache-"))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))


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


@pytest.fixture(scope="session")
def toy_run(tmp_path_factory):
    """One finished toy run for the whole test run, made once through the CLI (in-process actors, no
    Ray): 3 steps, an evaluation at step 2 and at the end. Tests that change a run copy it first.
    Returns (working folder, run folder, the summary JSON)."""
    import json
    import subprocess

    cwd = tmp_path_factory.mktemp("toy-run")
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "mas-lab"),
            "run",
            str(ROOT / "tasks" / "toy.yaml"),
            "--no-ray",
            "--set",
            "train.steps=3",
            "--set",
            "train.eval_every=2",
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    return cwd, cwd / summary["run_dir"], summary


def isolation_for_tests():
    """The sandbox's isolation here; on a machine where bubblewrap does not work, the fallback is
    allowed (tests of what each isolation grants skip what it lacks, saying so)."""
    from mas_lab.sandbox import isolation as sandbox

    try:
        return sandbox.capabilities()
    except sandbox.SandboxUnavailable:
        sandbox.configure(allow_fallback=True)
        return sandbox.capabilities()


RAY_BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def cluster_processes(temp_dir: str) -> list[psutil.Process]:
    """The processes of the cluster this test started (their command lines name its temp dir)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(temp_dir in part for part in proc.info["cmdline"] or []):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


@pytest.fixture
def cluster(request):
    """A real two-node Ray cluster on this machine (`ray start --head` and a second `ray start
    --address`, 2 CPUs each): yields (address, its temp dir, the environment the head and worker
    were started with, for the processes the test starts); stopped afterwards. By default with
    token auth, the machine's token made first where it has none (`ray get-auth-token --generate`,
    what Ray's docs tell a user to do): `ray start --head` turns auth on only where it finds a
    token, so on a fresh machine the test would otherwise depend on whether an earlier test's
    local `ray.init()` had made one. Parametrized indirectly with "no-auth", the head, the worker
    and every process the test starts see an empty home (no token): a cluster without auth."""
    temp_dir = tempfile.mkdtemp(prefix="rc", dir="/tmp")  # short: Ray's socket paths have a length limit
    port = _free_port()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    if getattr(request, "param", "token") == "no-auth":
        home = Path(temp_dir) / "home"
        home.mkdir()
        env = {k: v for k, v in env.items() if not k.startswith("RAY_AUTH")} | {"HOME": str(home)}
    else:
        subprocess.run([str(RAY_BIN / "ray"), "get-auth-token", "--generate"], check=True, capture_output=True, env=env)
        env["RAY_AUTH_MODE"] = "token"
    common = ["--num-cpus", "2", "--temp-dir", temp_dir, "--disable-usage-stats"]
    try:
        for args in (
            ["--head", "--port", str(port), "--include-dashboard", "false"],
            ["--address", f"127.0.0.1:{port}"],
        ):
            started = subprocess.run(
                [str(RAY_BIN / "ray"), "start", *args, *common], capture_output=True, text=True, env=env, timeout=180
            )
            assert started.returncode == 0, started.stderr[-3000:]
        yield f"127.0.0.1:{port}", temp_dir, env
    finally:
        procs = cluster_processes(temp_dir)
        for proc in procs:
            proc.terminate()
        _, alive = psutil.wait_procs(procs, timeout=20)
        for proc in alive:
            proc.kill()
        shutil.rmtree(temp_dir, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`make test-all`), the tests that start Ray run on one worker, one after
    another: two local Ray instances or clusters at once would fight over the two cores' CPUs that
    their actors reserve, and the other worker keeps the rest of the tests moving meanwhile."""
    for item in items:
        if item.get_closest_marker("ray"):
            item.add_marker(pytest.mark.xdist_group("ray"))


def run_task(cwd: Path, task: str, *args: str, sets: tuple[str, ...] = ()):
    """`mas-lab run tasks/<task> ARGS --set S...` in `cwd`, which must succeed; returns its
    summary (the last line it printed) and its run store."""
    import json

    from mas_lab.records.store import RunStore

    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "mas-lab"),
            "run",
            str(ROOT / "tasks" / task),
            *args,
            *[a for s in sets for a in ("--set", s)],
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.splitlines()[-1])
    return summary, RunStore(cwd / summary["run_dir"] / "run.db", create=False)
