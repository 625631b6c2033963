"""The step between our process and bubblewrap that applies a program's limits: a small
interpreter, started with vfork (no preexec_fn), that joins the program's memory cgroup, sets its
rlimits, drops to the slot's uid and execs bwrap.

Why not a Popen preexec_fn: a preexec_fn makes CPython fork our whole process, and a trainer
that holds a model, its optimizer and the sampler's caches in one process (`mas-lab run --no-ray`)
is gigabytes; copying its page tables (under `_children_lock`, one program at a time) cost more
than the program itself (docs/measurements-log.md, "The sandbox's start in a large process").
Without a preexec_fn CPython uses vfork, whose cost does not grow with our size; the limits are
then applied by this stage, in the same process that becomes bwrap, before bwrap runs anything of
the program. What it applies is what the preexec_fn applied, in the same order (the cgroup first:
joining needs root's rights, dropped last).

A failure of the stage itself (the cgroup refused is not one: the program then runs under its
rlimits, as before) is written to a status pipe that closes when the stage execs bwrap (as Popen's
own error pipe): `wait_exec` reads it and raises OSError, which the sandbox reports as the
machinery's failure (sandbox_error). The program cannot write to that pipe (it is closed before
bwrap runs), so no exit code or stderr of a program passes for the stage's failure.
"""

from __future__ import annotations

import os
import resource

FAILED = "mas-lab sandbox stage: "

# run with -I -S: no site, no environment, nothing of ours importable; builtins and os/resource only
SOURCE = """\
import os, resource, sys
status = int(sys.argv[1])
try:
    os.set_inheritable(status, False)  # closed when bwrap starts: the parent reads EOF, no error
    procs, uid, rlimits = sys.argv[2:5]
    if procs:
        try:
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, str(os.getpid()).encode())
            finally:
                os.close(fd)
        except OSError:
            pass
    for triple in rlimits.split(";"):
        which, soft, hard = map(int, triple.split(","))
        resource.setrlimit(which, (soft, hard))
    if int(uid) >= 0:
        os.setgroups([])
        os.setgid(int(uid))
        os.setuid(int(uid))
    os.execv(sys.argv[5], sys.argv[5:])
except BaseException as exc:
    os.write(status, (type(exc).__name__ + ": " + str(exc)).encode())
    os._exit(125)
"""


def command(
    interpreter: str,
    target: list[str],
    *,
    status_fd: int,
    cgroup_procs: str | None,
    rlimits: list[tuple[int, int, int]],
    uid: int | None,
) -> list[str]:
    """The argv that joins the cgroup, sets `rlimits` ((resource, soft, hard), in order), drops to
    `uid` and then execs `target` (bwrap and its arguments)."""
    assert rlimits and all(isinstance(v, int) and 0 <= v != resource.RLIM_INFINITY for r in rlimits for v in r), rlimits
    return [
        interpreter,
        "-I",
        "-S",
        "-B",
        "-c",
        SOURCE,
        str(status_fd),
        cgroup_procs or "",
        str(-1 if uid is None else uid),
        ";".join(",".join(map(str, r)) for r in rlimits),
        *target,
    ]


def wait_exec(status_read: int) -> None:
    """Block until the stage has exec'd bwrap (EOF on the status pipe) or failed; raise OSError
    with the stage's reason when it failed. Closes `status_read`."""
    chunks = []
    try:
        while chunk := os.read(status_read, 4096):
            chunks.append(chunk)
    finally:
        os.close(status_read)
    if chunks:
        raise OSError(FAILED + b"".join(chunks).decode(errors="replace"))
