"""The sandbox contains bad programs and reports them with the right status."""
from mas_lab.sandbox import Limits, run_many, run_python


def test_ok_error_timeout_and_output_cap():
    assert run_python("print('hi')").status == "ok"
    error = run_python("raise ValueError('x')")
    assert error.status == "error" and "ValueError" in error.stderr
    slow = run_python("while True: pass", Limits(wall_s=0.5, cpu_s=5))
    assert slow.status == "timeout" and slow.duration < 3
    big = run_python("print('x' * 100000)", Limits(output_chars=100))
    assert big.status == "ok" and len(big.stdout) == 100


def test_memory_bomb_and_cpu_limit_are_contained():
    bomb = run_python("x = bytearray(2 * 1024 ** 3)", Limits(memory_mb=256))
    assert bomb.status == "error" and "MemoryError" in bomb.stderr
    spin = run_python("while True: pass", Limits(wall_s=10, cpu_s=1))
    assert spin.status == "killed" and spin.duration < 5


def test_runs_in_a_fresh_folder_with_a_minimal_environment(monkeypatch):
    monkeypatch.setenv("SECRET_TOKEN", "hunter2")
    result = run_python("import os; print(os.getcwd()); print(sorted(os.environ))")
    assert "mas-lab-sandbox-" in result.stdout and "SECRET_TOKEN" not in result.stdout


def test_children_are_killed_with_the_group():
    code = "import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\ntime.sleep(30)"
    result = run_python(code, Limits(wall_s=0.5))
    assert result.status == "timeout" and result.duration < 5


def test_many_run_concurrently():
    results = run_many([f"print({i})" for i in range(6)])
    assert [r.stdout.strip() for r in results] == [str(i) for i in range(6)]
