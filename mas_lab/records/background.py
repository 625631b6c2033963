"""Work on a thread whose error is raised where it is collected (background checkpoint writes)."""

from __future__ import annotations

import threading
from typing import Any, Callable


class Background:
    """Runs `work()` on a daemon thread now; `result()` waits for it and returns its value or
    raises its exception on the caller's thread."""

    def __init__(self, work: Callable[[], Any], name: str):
        self._outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                self._outcome["value"] = work()
            except BaseException as exc:  # raised by result()
                self._outcome["error"] = exc

        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self) -> Any:
        self._thread.join()
        if "error" in self._outcome:
            raise self._outcome["error"]
        return self._outcome.get("value")
