"""Render one screen of the dashboard on a run folder to an SVG file (Textual's own screenshot),
for the README and docs: the image is what the program draws for that store.

    .venv/bin/python tools/screenshot.py RUN_DIR OUT.svg [--mode live|groups|replay] [--size 160x48]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
from pathlib import Path

from tui.app import MasLabApp


async def render(run_dir: Path, out: Path, mode: str, size: tuple[int, int]) -> None:
    app = MasLabApp(run_dir, mode)
    async with app.run_test(size=size) as pilot:
        for _ in range(100):  # the live screen reads the store in a worker: wait for its charts
            await pilot.pause(0.1)
            if mode != "live" or (
                "step " in str(app.screen.query_one("#run-header").render()) and app.screen.query("Chart")
            ):
                break
        await pilot.pause(0.5)
        app.save_screenshot(filename=out.name, path=str(out.parent))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--mode", default="live", choices=["live", "groups", "replay"])
    parser.add_argument("--size", default="160x48")
    args = parser.parse_args()
    width, height = (int(x) for x in args.size.split("x"))
    with tempfile.TemporaryDirectory() as folder:  # readers never touch a shipped store: a copy
        copy = Path(folder) / args.run_dir.name
        shutil.copytree(args.run_dir, copy)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        asyncio.run(render(copy, args.out.resolve(), args.mode, (width, height)))
    print(args.out)


if __name__ == "__main__":
    main()
