"""The MLflow UI as a child process of `mas-lab ui`: started on 127.0.0.1, announced once it answers
(the server takes 20-60 s to start on 2 cores: an address printed at launch answered nothing for
that long), and stopped with every worker it forked when this process is interrupted or killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Callable

from mas_lab.sandbox.children import die_with_parent


def answers(url: str, timeout: float = 1.0) -> bool:
    """Whether an HTTP server answers at `url` (any status: it is up)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout):
            return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError):
        return False


def serve(uri: str, port: int, on_ready: Callable[[str], None], poll_s: float = 0.5) -> int:
    """Run `mlflow ui` on the tracking store `uri` at 127.0.0.1:`port` until it exits or this
    process gets SIGINT/SIGTERM; `on_ready(url)` is called once, when the server first answers.
    Returns the server's exit code (0 when interrupted)."""
    command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", "127.0.0.1"]
    command += ["--port", str(port)]
    # its workers share its process group; it gets SIGTERM if this process is killed
    server = subprocess.Popen(command, start_new_session=True, preexec_fn=die_with_parent)
    url = f"http://127.0.0.1:{port}"
    stop = threading.Event()

    def announce() -> None:
        while not stop.is_set() and server.poll() is None:
            if answers(url):
                on_ready(url)
                return
            time.sleep(poll_s)

    watcher = threading.Thread(target=announce, daemon=True)

    def _interrupt(signum, frame):
        raise KeyboardInterrupt  # SIGTERM stops the server as Ctrl+C does

    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)  # also where SIGINT came inherited as ignored (a background job's)
    watcher.start()
    try:
        code = server.wait()
    except KeyboardInterrupt:
        code = 0
    finally:
        stop.set()
        try:
            os.killpg(server.pid, signal.SIGTERM)  # the server and the workers it forked
            server.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(server.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return code
