"""The paper's comparison (Table 1's shape) at CPU scale: the study studies/paper.yaml.

    mas-lab study studies/paper.yaml [--task plan_path sokoban] [--seeds 0 1 2] [--only NAME ...]
        [--jobs 1] [--address HOST:PORT] [--report-only] [--set key=value ...]      (make reproduce)
    .venv/bin/python -m mas_lab.study.reproduce [the same options]                  (the same, kept for old notes)

Three task families, each on its own settings (a format warm-up, then steps x 8 problems x K 4,
greedy evaluation on 64 held-out problems every 10 steps): Plan-Path on the paper's observation with
a solver the tool agent can call (tasks/plan_path_tool.yaml), Plan-Path spelling the move letters
(tasks/plan_path_learns.yaml: 3x3, goal 1-4 moves away) and Sokoban (tasks/sokoban_learns.yaml: 6x6,
one box, 1-2 moves). Trained regimes (Plan-Path's files; the others are named alike):

- single agent + GRPO        tasks/plan_path_learns_single_agent.yaml
- MAS + trajectory GRPO      tasks/plan_path_learns.yaml with algorithm.mode=trajectories
- MAS + AT-GRPO shared       tasks/plan_path_learns.yaml
- MAS + AT-GRPO per-role LoRA  tasks/plan_path_learns_per_role_lora.yaml
- MAS + AT-GRPO per-role full  tasks/plan_path_learns_per_role_full.yaml (the shared run's lr: it
  separates the split into two policies from LoRA)

The untrained rows are the step-0 evaluations of those runs (the same held-out problems for the
same seed; every MAS regime starts from the same base model, so MAS untrained is read from the
AT-GRPO shared runs). Each run is a real `mas-lab run --no-ray` (one process, so its CPU time is
exact) whose run folder stays in the task's work folder (checkpoints, log); once finished, its
summary and its store (xz-compressed) are kept in the repository, results/reproduce/<task>/<regime>/
seed-<n>/, the report is built from those alone, and a kept run is not run again. A run an earlier
session left unfinished continues from its last checkpoint (`mas-lab run --resume`), losing at most
the step in flight. After each per-role run, the swap ablation: `mas-lab eval --swap-policies` on
its final checkpoint. After every run the family's generated section of docs/results/paper.md and its
curves (docs/images/reproduce_<task>.png) are rewritten from what is complete.
"""

from __future__ import annotations

import argparse
import json

from mas_lab.study.driver import run_study, summary_rows
from mas_lab.study.families import Family, archive_folder, slug
from mas_lab.study.plots import curves, mean_curve
from mas_lab.study.report import (
    baseline_verdicts,
    constant_baseline,
    orderings,
    outcomes,
    precision_line,
    report,
    rule_baselines,
    swap_lines,
    table,
)
from mas_lab.study.runner import STORE, complete, run_regime
from mas_lab.study.spec import paper_families

FAMILIES = paper_families()  # studies/paper.yaml's tasks, by key

__all__ = [
    "FAMILIES",
    "STORE",
    "Family",
    "archive_folder",
    "baseline_verdicts",
    "complete",
    "constant_baseline",
    "curves",
    "mean_curve",
    "orderings",
    "outcomes",
    "precision_line",
    "report",
    "rule_baselines",
    "run_regime",
    "slug",
    "swap_lines",
    "table",
]


def main() -> None:
    parser = argparse.ArgumentParser(description="the paper's comparison: mas-lab study studies/paper.yaml")
    parser.add_argument("--task", nargs="+", choices=list(FAMILIES), default=["plan_path"], help="task families")
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    parser.add_argument("--only", nargs="+", default=None, help="regime names (default: all)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once; each gets cores/jobs torch threads")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--set", action="append", default=[], help="an override for every run (smoke tests)")
    args = parser.parse_args()
    results = run_study(
        [FAMILIES[key] for key in args.task],
        seeds=args.seeds,
        only=args.only,
        jobs=args.jobs,
        extra=args.set,
        report_only=args.report_only,
    )
    print(json.dumps(summary_rows(results)))


if __name__ == "__main__":
    main()
