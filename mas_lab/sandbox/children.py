"""Child processes that do not outlive their parent: `die_with_parent` as a Popen preexec_fn asks
Linux to send the child SIGTERM when the thread that started it dies (prctl PR_SET_PDEATHSIG), so a
killed study driver's runs checkpoint and stop, and a killed `mas-lab ui` takes its server along."""

from __future__ import annotations

import ctypes
import signal

PR_SET_PDEATHSIG = 1


def _prctl():
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        return None


_PRCTL = _prctl()  # looked up before any fork: the child only calls it (no import, no lock)


def die_with_parent() -> None:
    """In the child, between fork and exec. The parent is the starting *thread*: start children
    from a thread that lives as long as they should."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM)
