"""Does the answerer use the tool's output? Read from a Plan-Path run store (tool_helper: solver),
per evaluation step and split, for the first chosen answer that was shown a program's output (the
team's planner at turn 0; a single agent with the tool (`program_then_answer`) at turn 1, after its
own program): how often its first
move is the first move the tool's program printed, how often it is a move toward the goal by the
coordinates (what a reading rule would do), and how often the whole answer is the tool's move list.
On the hard split (a detour needed) the tool's first move and the straight way's part often differ,
which tells copying from reading.

    .venv/bin/python experiments/tool_use.py RUN_DIR_or_run.db [--step N]   # prints JSON lines
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from mas_lab.envs.games import OUTPUT_HEADER
from mas_lab.envs.plan_path import parse_answer_moves
from mas_lab.records.store import RunStore


def toward(problem: dict) -> set[str]:
    """The moves that bring S closer to G by the coordinates (walls ignored)."""
    (sr, sc), (gr, gc) = problem["start"], problem["goal"]
    return {m for m, near in (("U", gr < sr), ("D", gr > sr), ("L", gc < sc), ("R", gc > sc)) if near}


def tool_moves(observation: str) -> list[str]:
    """The moves the tool's program printed, as the answerer was shown them (the line after OUTPUT_HEADER)."""
    found = re.search(re.escape(OUTPUT_HEADER) + "(.*)", observation)
    return re.findall(r"\b[UDLR]\b", found.group(1)) if found else []


def summarise(db_path: Path, eval_problems: int, step: int | None = None) -> list[dict]:
    store = RunStore(db_path, create=False)
    first: dict[tuple[int, int], dict] = {}  # (step, episode) -> its first answer shown a program's output
    for record in store.candidate_records(kind="eval", chosen_only=True):
        key = (record["step"], record["episode"])
        if OUTPUT_HEADER not in record["observation"] or (step is not None and key[0] != step):
            continue
        if key not in first or record["turn"] < first[key]["turn"]:
            first[key] = record
    out: dict[tuple[int, str], dict] = {}
    for (at, idx), record in sorted(first.items()):
        split = "hard" if idx >= eval_problems else "main"
        row = out.setdefault(
            (at, split),
            {
                "step": at,
                "split": split,
                "episodes": 0,
                "team_success": 0,
                "tool_printed_moves": 0,
                "first_move_is_tools": 0,
                "first_move_toward_goal": 0,
                "answer_is_tools_list": 0,
            },
        )
        moves, printed = parse_answer_moves(record["response"]) or [], tool_moves(record["observation"])
        row["episodes"] += 1
        row["team_success"] += int(record["episode_success"])
        row["tool_printed_moves"] += bool(printed)
        row["first_move_is_tools"] += bool(moves and printed and moves[0] == printed[0])
        row["first_move_toward_goal"] += bool(moves and moves[0] in toward(record["problem"]))
        row["answer_is_tools_list"] += bool(moves and moves == printed)
    store.close()
    return list(out.values())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run", type=Path, help="a run folder or its run.db")
    parser.add_argument("--step", type=int)
    args = parser.parse_args()
    db_path = args.run / "run.db" if args.run.is_dir() else args.run
    import yaml

    task = yaml.safe_load((db_path.parent / "task.yaml").read_text())
    for row in summarise(db_path, task["train"]["eval_problems"], args.step):
        print(json.dumps(row))


if __name__ == "__main__":
    main()
