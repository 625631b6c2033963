"""The sandbox never silently weakens: a failed bubblewrap probe is retried, and without it
programs are refused (status sandbox_error, the run stops) unless the task allows the fallback;
bubblewrap's own failures are sandbox_error, never the program's error; slots (uids) are unique on
the machine; bubblewrap's orphaned namespace inits are reaped where mas-lab is their parent."""

import os
import subprocess
import sys
import textwrap

import pytest

from mas_lab.sandbox import isolation as sandbox
from mas_lab.sandbox.isolation import Limits, run_python

needs_bwrap = pytest.mark.skipif(sandbox._bwrap_binary() is None, reason="no bwrap binary")


@pytest.fixture
def fresh(monkeypatch):
    """A sandbox module that has found nothing yet, restored afterwards."""
    monkeypatch.setattr(sandbox, "_found", None)
    monkeypatch.setattr(sandbox, "_failed", None)
    monkeypatch.setattr(sandbox, "_allow_fallback", False)
    monkeypatch.setattr(sandbox, "_refusals", [])
    monkeypatch.setattr(sandbox.time, "sleep", lambda s: None)
    yield monkeypatch


def test_without_bubblewrap_programs_are_refused_unless_the_fallback_is_allowed(fresh):
    fresh.setattr(sandbox, "_bwrap_binary", lambda: "/bin/false")  # a bwrap that never works
    refused = run_python("print('hi')")
    assert refused.status == "sandbox_error" and "resources.sandbox_fallback" in refused.stderr
    assert "failed its probe" in sandbox.take_refusal() and sandbox.take_refusal() is None
    assert run_python("print('hi')").status == "sandbox_error"  # no silent fallback later either
    sandbox.configure(allow_fallback=True)
    allowed = run_python("print('hi')")
    assert allowed.ok and sandbox.capabilities().kind == "fallback"
    sandbox.configure(allow_fallback=False)
    assert sandbox._found is None  # the fallback is not kept once it is not allowed


@needs_bwrap
def test_a_probe_that_fails_once_is_retried(fresh):
    real, calls = sandbox._run, []

    def flaky(code, limits, isolation, stdin=""):
        calls.append(isolation.kind)
        if len(calls) == 1:  # a neighbour's fork bomb, say
            return sandbox.SandboxResult("sandbox_error", "", "bwrap: clone: Resource temporarily unavailable", 0.0)
        return real(code, limits, isolation, stdin)

    fresh.setattr(sandbox, "_run", flaky)
    assert sandbox.capabilities().kind == "bubblewrap" and calls == ["bubblewrap", "bubblewrap"]


@needs_bwrap
def test_a_sandbox_that_cannot_be_set_up_is_tried_again(fresh):
    """A momentary setup failure (EAGAIN from clone beside a neighbour's programs) gives the
    program's own result on a later try; a failure that persists is the status after three."""
    sandbox.capabilities()  # the probe first: its own programs are not counted here
    real, calls = sandbox._run_unchecked, []

    def failing(times):
        def run(code, limits, isolation, stdin, started):
            calls.append(1)
            if len(calls) <= times:
                return sandbox.SandboxResult(
                    "sandbox_error", "", "bwrap: clone: Resource temporarily unavailable", 0.0, 1
                )
            return real(code, limits, isolation, stdin, started)

        return run

    fresh.setattr(sandbox, "SETUP_RETRY_S", (0.0, 0.0))
    for fails in (1, 2):
        calls.clear()
        fresh.setattr(sandbox, "_run_unchecked", failing(fails))
        result = run_python("print('hi')")
        assert result.ok and result.stdout == "hi\n" and len(calls) == fails + 1
    calls.clear()
    fresh.setattr(sandbox, "_run_unchecked", failing(5))
    result = run_python("print('hi')")
    assert result.status == "sandbox_error" and "Resource temporarily" in result.stderr and len(calls) == 3


@needs_bwrap
def test_bubblewraps_own_failure_is_a_sandbox_error_not_the_programs(fresh):
    command = sandbox._bwrap_command
    fresh.setattr(sandbox, "_bwrap_command", lambda *a: [command(*a)[0], "--no-such-option", *command(*a)[1:]])
    isolation = sandbox.Isolation(
        "bubblewrap", True, "nobody" if os.geteuid() == 0 else None, sandbox.SYSTEM_PYTHON, sandbox._bwrap_binary()
    )
    result = sandbox._run("print('hi')", Limits(), isolation)
    assert result.status == "sandbox_error" and result.stderr.startswith("bwrap: ")


@pytest.mark.skipif(os.geteuid() != 0, reason="slots (uids) are used only as root")
def test_slots_are_unique_across_processes():
    slot, fd = sandbox._claim_slot(5)
    try:
        other = subprocess.run(
            [
                sys.executable,
                "-c",
                "from mas_lab.sandbox import isolation\nslots = [isolation._claim_slot(5)[0] for _ in range(3)]\n"
                "print(' '.join(map(str, slots)))",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        taken = [int(x) for x in other.stdout.split()]
        assert len(set(taken)) == 3 and slot not in taken, (slot, taken)
    finally:
        sandbox._release_slot(fd)


@needs_bwrap
def test_a_reaper_never_takes_the_exit_status_of_a_concurrent_run():
    """As a child subreaper, programs run from 4 threads at once keep their own exit status: the
    orphan reaper of one run must not wait for another run's bwrap before its Popen does (that
    Popen would read 0, and a failing program would pass). 76-84 of 200 read 0 before the fix."""
    script = textwrap.dedent("""
        import ctypes
        from concurrent.futures import ThreadPoolExecutor
        ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
        from mas_lab.sandbox.isolation import run_python
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda _: run_python("import sys; sys.exit(3)"), range(200)))
        print(sorted({(r.status, r.returncode) for r in results}))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split("\n")[-2] == "[('error', 3)]", result.stdout


def test_the_reaper_leaves_a_pid_that_became_one_of_our_bwraps_while_it_waited(monkeypatch):
    """An inherited orphan's pid, freed by another thread's reaper and handed by the kernel to a
    bwrap this process starts, belongs to that bwrap's Popen: the reaper checks again under the
    lock before each wait and stops (a wait would take the new run's exit status). Fakes stand in
    for /proc and waitpid: a reused pid within the 2 s window cannot be arranged for real."""
    orphan = 424242
    waits = []

    def waitpid(pid, flags):
        waits.append(pid)
        sandbox._our_bwraps.add(pid)  # next: reaped elsewhere, the pid reused by a new bwrap of ours
        return 0, 0

    monkeypatch.setattr(sandbox, "_is_subreaper", lambda: True)
    monkeypatch.setattr(sandbox, "_bwrap_children", lambda parent: [orphan])
    monkeypatch.setattr(sandbox, "_is_bwrap_child", lambda pid, parent: True)
    monkeypatch.setattr(sandbox.os, "waitpid", waitpid)
    monkeypatch.setattr(sandbox, "_our_bwraps", set())
    sandbox._reap_orphans()
    assert waits == [orphan]  # once while it was the orphan, never after it became ours


@needs_bwrap
def test_orphaned_namespace_inits_are_reaped_where_we_are_their_parent(tmp_path):
    """As a child subreaper (what a container's PID 1 is), 40 programs leave no bwrap zombie."""
    script = textwrap.dedent("""
        import ctypes, os
        ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
        from mas_lab.sandbox.isolation import run_python
        for _ in range(40):
            assert run_python("print(1)").ok
        zombies = []
        for entry in os.listdir("/proc"):
            try:
                text = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            state, parent = text[text.rindex(")") + 2:].split()[:2]
            if state == "Z" and int(parent) == os.getpid():
                zombies.append(text[text.index("(") + 1 : text.rindex(")")])
        print(zombies)
        print(len(zombies))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert int(result.stdout.split()[-1]) == 0, result.stdout  # the zombies' names, if any


@needs_bwrap
def test_the_limits_are_in_force_inside_the_program():
    """The stage (sandbox/stage.py) sets them before bwrap runs: the program's own limits say so."""
    limits = Limits(cpu_s=3, memory_mb=400, file_mb=5, open_files=50)
    result = run_python("print(open('/proc/self/limits').read())", limits)
    assert result.ok, result.stderr
    rows = {line[:26].strip(): line[26:].split()[:2] for line in result.stdout.splitlines()[1:] if line.strip()}
    assert rows["Max cpu time"] == ["3", "4"]
    assert rows["Max address space"] == [str(400 * 2**20)] * 2
    assert rows["Max file size"] == [str(5 * 2**20)] * 2
    assert rows["Max open files"] == ["50", "50"]
    assert rows["Max core file size"] == ["0", "0"]
    assert rows["Max processes"][0] == rows["Max processes"][1] != "unlimited"


@needs_bwrap
def test_the_sandbox_starts_without_a_preexec_fn(fresh):
    """A preexec_fn makes CPython fork our whole process (gigabytes in a `--no-ray` run); without
    one it uses vfork. Every argument of the bwrap path's Popen is checked."""
    sandbox.capabilities()
    seen = []
    real = subprocess.Popen

    def recording(*args, **kwargs):
        seen.append(kwargs)
        return real(*args, **kwargs)

    fresh.setattr(sandbox.subprocess, "Popen", recording)
    assert run_python("print('hi')").stdout == "hi\n"
    assert seen and all(kwargs.get("preexec_fn") is None for kwargs in seen)


@needs_bwrap
def test_the_stages_failure_is_a_sandbox_error_and_a_program_cannot_fake_one(fresh):
    """The stage reports through a pipe closed before bwrap starts, so a program that exits as the
    stage does is still the program's error."""
    from mas_lab.sandbox import stage

    isolation = sandbox.capabilities()
    faked = run_python(f"import os, sys\nsys.stderr.write({stage.FAILED!r} + 'OSError: x')\nos._exit(125)")
    assert faked.status == "error" and faked.returncode == 125
    fresh.setattr(sandbox, "_bwrap_command", lambda *a: ["/nonexistent/bwrap"])
    failed = sandbox._run("print('hi')", Limits(), isolation)
    assert failed.status == "sandbox_error" and stage.FAILED + "FileNotFoundError" in failed.stderr
