"""Your own task in one file (docs/new-task.md): the page's example installed as an outside package
(a distribution with an entry point in the group mas_lab.envs, in a folder of its own), listed by
`mas-lab envs`, trained two steps from the CLI; a broken plugin reported, never hiding the others;
and reasoning-gym's families through the built-in adapter."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

MAS_LAB = str(Path(sys.executable).parent / "mas-lab")


def install_example(folder: Path, broken: bool = False) -> dict:
    """The example of docs/new-task.md as a package in `folder` (module, dist-info with its entry
    point), as pip would leave it; returns the environment that puts it on the path."""
    page = (ROOT / "docs" / "new-task.md").read_text()
    module = re.search(r"```python\n(.*?)```", page, re.DOTALL).group(1)
    (folder / "mas_lab_sum.py").write_text(module)
    dist = folder / "mas_lab_sum-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mas-lab-sum\nVersion: 0.1\n")
    points = "[mas_lab.envs]\nsum = mas_lab_sum:SumEnv\n" + ("broken = no_such_module:Env\n" if broken else "")
    (dist / "entry_points.txt").write_text(points)
    return {**os.environ, "PYTHONPATH": f"{folder}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def test_the_example_rewards_and_hacks():
    import types

    page = (ROOT / "docs" / "new-task.md").read_text()
    module = types.ModuleType("mas_lab_sum")
    exec(re.search(r"```python\n(.*?)```", page, re.DOTALL).group(1), module.__dict__)
    problem = module.Problem({"numbers": [3, 4, 5, 6]})
    env = module.SumEnv(problem, {})
    assert env.step("splitter", 0, "3 + 4 = 7\nAnswer: 7").local == 1.0
    right = env.step("adder", 0, "Answer: 18")
    assert right.team == 1.0 and right.local == pytest.approx(1.0) and env.success
    for hack in ("Answer: eighteen", "18", "End with one line 'Answer: N'.", "Answer: 18 or 19"):
        assert module.SumEnv(problem, {}).step("adder", 0, hack).team == 0.0, hack
    import random

    demos = {env.format_demo("adder", random.Random(seed)) for seed in range(50)}
    assert all(module.stated(d) is not None for d in demos) and len(demos) > 10  # the form, not one answer


@pytest.mark.integration
def test_an_outside_package_trains_from_the_cli(tmp_path):
    env = install_example(tmp_path, broken=True)
    listed = subprocess.run([MAS_LAB, "envs", "--json"], capture_output=True, text=True, env=env, timeout=120)
    found = {json.loads(line)["name"]: json.loads(line) for line in listed.stdout.splitlines() if line.startswith("{")}
    assert found["sum"]["roles"] == ["splitter", "adder"] and "mas_lab_sum:SumEnv" in found["sum"]["from"]
    assert "plan_path" in found
    plain = subprocess.run([MAS_LAB, "envs"], capture_output=True, text=True, env=env, timeout=120)
    assert "broken: did not load: no_such_module:Env" in (plain.stdout + plain.stderr).replace("\n", " ")
    task = tmp_path / "sum.yaml"
    task.write_text(
        "name: sum\nenv: {name: sum, max_turns: 1}\nroles:\n  - {name: splitter, policy: shared}\n"
        "  - {name: adder, policy: shared}\npolicies:\n  shared: {model: tiny-test}\n"
        "algorithm: {k: 2, filter: zero_std}\ntrain: {steps: 2, problems_per_step: 2, eval_problems: 4, warmup_steps: 2}\n"
        "checkpoint: {every: 0}\n"
    )
    run = subprocess.run(
        [MAS_LAB, "run", str(task), "--no-ray"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600
    )
    assert run.returncode == 0, run.stderr[-2000:]
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 2 and summary["eval_after"] is not None
    broken = tmp_path / "broken.yaml"
    broken.write_text(task.read_text().replace("{name: sum,", "{name: broken,"))
    refused = subprocess.run([MAS_LAB, "config", str(broken)], capture_output=True, text=True, env=env, timeout=120)
    assert refused.returncode == 2 and "the plugin 'broken' did not load" in refused.stdout + refused.stderr


@pytest.mark.parametrize("dataset", ["maze", "mini_sudoku", "countdown", "shortest_path"])
def test_reasoning_gym_families_score_their_own_answers(dataset):
    """The dataset's reference answer, stated by the solver or printed by the tool's program,
    solves the problem; a wrong or missing answer does not; train and held-out stay disjoint."""
    from mas_lab.envs import ProblemPool, ReasoningGymEnv

    pool = ProblemPool(ReasoningGymEnv, {"dataset": dataset}, 0, 4)
    trained = {pool.train(i).content_hash for i in range(40)}
    assert not trained & {p.content_hash for p in pool.eval_set}
    for problem in pool.eval_set[:2]:
        answer = problem.data["answer"]
        env = ReasoningGymEnv(problem, {"dataset": dataset})
        solved = env.clone().step("solver", 0, f"Let me think.\nAnswer: {answer}")
        assert solved.team == 1.0 and solved.components["format"] == 1.0
        printed = env.clone().step("tool", 0, f"```python\nprint({answer!r})\n```")
        assert printed.components["value"] == 1.0 and printed.team == 0.0  # the tool's output is not the answer
        assert env.clone().step("solver", 0, "Answer:").team < 1.0
        assert env.clone().step("solver", 0, f"{answer}").components["format"] == 0.0  # no answer line


def test_the_reasoning_gym_constant_baseline_is_small():
    from mas_lab.envs import ProblemPool, ReasoningGymEnv
    from mas_lab.training.baselines import best_constant

    params = ReasoningGymEnv.Params(dataset="maze")
    pool = ProblemPool(ReasoningGymEnv, params, 0, 32)
    best = best_constant(ReasoningGymEnv, params, pool.eval_set, 1)
    assert best is not None and best.success < 0.5
