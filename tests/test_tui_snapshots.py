"""Snapshot tests: every dashboard screen, at 100x30 and 160x48, on the committed toy sample run.

The SVGs live in tests/__snapshots__/; after a deliberate change to a screen, look at the new
pictures (`pytest tests/test_tui_snapshots.py --snapshot-report`) and accept them with
`pytest tests/test_tui_snapshots.py --snapshot-update`. The dev extra pins textual, plotext and the
snapshot plugin, so a new Textual release cannot fail these by itself.
"""

import shutil

import pytest
from conftest import ROOT

from tui.app import MasLabApp

SIZES = {"100x30": (100, 30), "160x48": (160, 48)}


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("snap") / "toy"
    shutil.copytree(ROOT / "sample_runs" / "toy", run_dir)
    return run_dir


def loaded(mode: str):
    """Wait until the screen shows the store's data (the live screen reads it in a worker)."""

    async def run_before(pilot) -> None:
        for _ in range(100):
            await pilot.pause(0.1)
            screen = pilot.app.screen
            if mode != "live" or ("step " in str(screen.query_one("#run-header").render()) and screen.query("Chart")):
                break
        await pilot.pause(0.5)

    return run_before


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("mode", ["live", "groups", "replay"])
def test_screen(snap_compare, toy, mode, size):
    assert snap_compare(MasLabApp(toy, mode), terminal_size=SIZES[size], run_before=loaded(mode))


@pytest.mark.parametrize("size", SIZES)
def test_help_screen(snap_compare, toy, size):
    assert snap_compare(
        MasLabApp(toy, "replay"), press=["question_mark"], terminal_size=SIZES[size], run_before=loaded("replay")
    )
