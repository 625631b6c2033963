"""Rewards a model under RL could raise without solving the task: each hack must earn nothing."""

import random
import time

import pytest
from conftest import ROOT
from fakes import FakeEngine

from mas_lab.config import load_task
from mas_lab.envs.base import Problem, ProblemPool
from mas_lab.envs.code_task import CodeEnv
from mas_lab.envs.datasets import code_problems
from mas_lab.envs.math_grading import grade
from mas_lab.envs.math_task import MathEnv
from mas_lab.envs.plan_path import PlanPathEnv, shortest_path
from mas_lab.envs.sokoban import SokobanEnv
from mas_lab.training.episodes import Episode, tree_rollout

RECORD = code_problems("mbpp")[0]  # remove_Occ(s, ch)


def as_coder(code: str, record: dict = RECORD):
    return CodeEnv(Problem(dict(record)), {}).step("coder", 0, f"```python\n{code}\n```")


def as_tester(tests: str, record: dict = RECORD):
    return CodeEnv(Problem(dict(record)), {}).step("tester", 0, f"```python\n{tests}\n```")


@pytest.mark.parametrize(
    "code",
    [
        "import os\nprint('{\"verdict\": [[true, true], [true, true], [true, true]]}', flush=True)\nos._exit(0)\n",
        "import os, json\nos.write(1, (json.dumps({'verdict': [[True, True]] * 3}) + '\\n').encode())\nos._exit(0)\n",
        "def exec(*args, **kwargs):\n    pass\ndef remove_Occ(s, ch):\n    return s\n",
        "class AssertionError(Exception):\n    pass\ndef remove_Occ(s, ch):\n    return s\n",
        "import re, sys\nsource = open(sys.argv[0]).read()\nEXPECTED = re.findall(r'== (\\S+)', source)\n"
        "def remove_Occ(s, ch):\n    return EXPECTED.pop(0) if EXPECTED else s\n",
        "raise SystemExit(0)\n",
        "import builtins\nbuiltins.exec = lambda *a, **k: None\ndef remove_Occ(s, ch):\n    return s\n",
    ],
    ids=[
        "verdict-line",
        "verdict-on-fd",
        "shadow-exec",
        "shadow-assertion",
        "read-own-source",
        "exit-at-import",
        "patch-builtins",
    ],
)
def test_the_coder_cannot_forge_the_golden_verdict(code):
    result = as_coder(code)
    assert result.team == 0.0 and result.components["golden_pass"] == 0.0


def test_a_coder_defining_a_builtin_cannot_answer_for_the_tests_checks():
    record = {
        "prompt": "area of a circle",
        "solution": "def area(r):\n    return 3.14159 * r * r\n",
        "tests": ["assert abs(area(2) - 12.566) < 0.01", "assert abs(area(1) - 3.1416) < 0.01"],
    }
    cheat = as_coder("def abs(x):\n    return 0\ndef area(r):\n    return 0\n", record)
    assert cheat.team == 0.0
    assert as_coder(record["solution"], record).team == 1.0


def test_the_real_solution_still_passes():
    assert as_coder(RECORD["solution"]).team == 1.0


@pytest.mark.parametrize(
    "tests,expected_local",
    [
        ("assert True", 0.0),
        ("assert 1 + 1 == 2", 0.0),
        ("assert remove_Occ('hello', 'l') is not None", 0.2),
        ("assert isinstance(remove_Occ('hello', 'l'), str)", 0.2),
        ("assert remove_Occ('hello', 'l') not in (None, 0, '', [], 'hello')", 0.2),
        ("import os\nassert os.write(1, b'{\"verdict\": [[true, true]]}\\n') and os._exit(0)", 0.0),
        ("assert not remove_Occ('hello', 'l').endswith('#')", 0.2),  # told the fixed '#' change apart
        ("assert remove_Occ('hello', 'l')[-1:] in 'hello'", 0.2),
        ("assert remove_Occ('hello', 'l') == 'heo'", 1.0),
    ],
)
def test_the_tester_earns_only_for_tests_that_check_values(tests, expected_local):
    assert as_tester(tests).local == pytest.approx(expected_local)


def test_assert_true_does_not_end_the_episode():
    env = CodeEnv(Problem(dict(RECORD)), {})
    env.step("coder", 0, "```python\ndef remove_Occ(s, ch):\n    return s\n```")
    env.step("tester", 0, "```python\nassert True\n```")
    assert not env.done


def test_math_grading_is_bounded_in_time_and_a_timeout_is_wrong():
    started = time.monotonic()
    assert grade("9^{9^{9}}", "6") is False
    assert time.monotonic() - started < 30
    assert grade("\\frac{1}{2}", "0.5") is True  # and the pool still grades after a timeout


def test_parallel_turns_adopt_the_scored_branch(tmp_path):
    data = tmp_path / "tiny.jsonl"
    data.write_text("\n".join('{"problem": "What is %d + %d?", "answer": "%d"}' % (i, i, 2 * i) for i in range(20)))
    task = load_task(
        ROOT / "tasks" / "math_tiny.yaml",
        [f"env.params.train={data}", "env.params.eval=math500", "algorithm.k=2", "env.max_turns=1"],
    )
    program = "```python\nimport random\nprint(random.randrange(10 ** 9))\n```"
    pool = ProblemPool(MathEnv, task.env.params, 0, 0)
    episodes = [Episode(i, pool.train(i), pool.make(pool.train(i))) for i in range(4)]
    tree_rollout(task, episodes, FakeEngine(lambda c, n: program if c else "\\boxed{1}"), 2, seed=0)
    for episode in episodes:
        tool = next(t for t in episode.turns if t.role == "tool")
        scored = tool.candidates[tool.chosen].info.split("answer=")[1].split(" gold=")[0]
        assert repr(episode.env.answers["tool"]) == scored


def test_no_evaluation_size_meets_a_training_problem():
    small = ProblemPool(PlanPathEnv, {"size": 4}, 0, 8)
    large = ProblemPool(PlanPathEnv, {"size": 4}, 0, 256)
    trained = {small.train(i).content_hash for i in range(3000)}
    assert not trained & {p.content_hash for p in large.eval_set}
    assert [p.content_hash for p in large.eval_set[:8]] == [p.content_hash for p in small.eval_set]


@pytest.mark.parametrize("env_cls", [PlanPathEnv, SokobanEnv])
def test_moves_in_prose_are_not_an_answer(env_cls):
    problem = env_cls.draw_problem(random.Random(3), {})
    for reply in (
        "I used the built-in u import and a loop",
        "Let me think: go up, then right.",
        "Moves: U then R",
        "moves are U R",
    ):
        assert env_cls(problem, {}).step("planner", 0, reply).components["format"] == 0.0
    if env_cls is PlanPathEnv:
        path = shortest_path(problem.data["grid"], tuple(problem.data["start"]), tuple(problem.data["goal"]))
        stated = env_cls(problem, {}).step("planner", 0, "Thinking...\n**Moves:** " + ", ".join(path))
        assert stated.components == {"format": 1.0, "value": 1.0}


def _open_grid_problem(start, goal, size=3):
    grid = ["." * size] * size
    return Problem(
        {
            "grid": grid,
            "start": list(start),
            "goal": list(goal),
            "shortest": abs(goal[0] - start[0]) + abs(goal[1] - start[1]),
        }
    )


def test_passing_through_the_goal_is_not_arriving():
    """A fixed sweep of the grid passes every cell: it must not count as reaching G."""
    sweep = "Moves: R R D L L D R R"  # visits all nine cells of an open 3x3 grid from (0, 0)
    env = PlanPathEnv(_open_grid_problem((0, 0), (1, 1)), {})
    result = env.step("planner", 0, sweep)
    assert not env.success and result.components["value"] < 1.0
    assert PlanPathEnv(_open_grid_problem((0, 0), (2, 2)), {}).step("planner", 0, sweep).components["value"] == 1.0


def test_an_illegal_plan_does_not_move_the_agent():
    """Bumping into the border as a stop ("D D D" ends on the bottom row from anywhere) is illegal:
    the plan is rejected whole and S stays, so no reward for the part before the bump."""
    env = PlanPathEnv(_open_grid_problem((0, 1), (2, 1)), {})
    result = env.step("planner", 0, "Moves: D D D")
    assert env.pos == (0, 1) and not env.success
    assert result.components == {"format": 0.0, "value": 0.0}


@pytest.mark.parametrize(
    "task_file, env_cls, most", [("plan_path_learns", PlanPathEnv, 16), ("sokoban_learns", SokobanEnv, 20)]
)
def test_no_constant_answer_solves_much_of_the_held_out_set(task_file, env_cls, most):
    """The best fixed answer of up to 4 moves solves at most ~1/4 (Plan-Path) or ~5/16 (Sokoban,
    where a push stays done while the player walks on) of a learns task's held-out set (Plan-Path's
    was 20/64 when a plan could stop at G or at the border; Sokoban's 14/32 of the one-push
    problems when a plan stopped once solved)."""
    from mas_lab.training.baselines import task_baseline

    task = load_task(ROOT / "tasks" / f"{task_file}.yaml")
    pool = ProblemPool(env_cls, task.env.params, task.train.seed, 64)
    best = task_baseline(task, pool.eval_set)
    assert best is not None and best.problems == 64 and best.solved <= most


@pytest.mark.parametrize("env_cls", [PlanPathEnv, SokobanEnv])
def test_the_prompts_format_line_is_not_a_legal_answer(env_cls):
    """A model echoing the prompt's format line must not score (the trained teams once collapsed
    onto the format example "Moves: R D ..."); a worked example's answer is one the constant-answer
    baseline tries, so a team copying it cannot look better than that baseline."""
    problem = env_cls.draw_problem(random.Random(5), {})
    for role in ("planner", "solver"):
        env = env_cls(problem, {})
        assert env.parse_answer(env.answer_hint) is None and env.parse_answer(env.observe(role, 0)) is None
        if env.answer_example:
            example = env.answer_example[env.answer_example.rindex("Moves:") :]
            assert env.parse_answer(example) is not None and example in env_cls.constant_answers(env.params)


def _open_sokoban(player, box, target, size=6):
    grid = ["#" * size] + ["#" + "." * (size - 2) + "#" for _ in range(size - 2)] + ["#" * size]
    return Problem(
        {"grid": grid, "player": list(player), "boxes": [list(box)], "targets": [list(target)], "optimal": 1}
    )


def test_sokoban_pushing_a_box_over_its_target_is_not_solving():
    """A plan is walked to its end: "R R R" pushes the box onto the target and off again (it once
    stopped when solved, so one fixed push-sweep solved every problem along its line)."""
    problem = _open_sokoban((2, 1), (2, 2), (2, 3))
    assert SokobanEnv(problem, {}).step("planner", 0, "Moves: R").components["value"] == 1.0
    over = SokobanEnv(problem, {})
    assert over.step("planner", 0, "Moves: R R").components["value"] < 1.0 and not over.success


def test_sokoban_an_illegal_plan_moves_nothing():
    """A push into the wall is illegal: the plan is rejected whole, the box and player stay."""
    env = SokobanEnv(_open_sokoban((2, 2), (2, 3), (3, 4)), {})
    result = env.step("planner", 0, "Moves: R R D")
    assert env.player == (2, 2) and env.boxes == frozenset({(2, 3)})
    assert result.components == {"format": 0.0, "value": 0.0}


def test_sokoban_max_moves_bounds_the_optimum():
    rng = random.Random(0)
    for _ in range(20):
        problem = SokobanEnv.draw_problem(
            rng, {"size": 6, "wall_prob": 0.0, "min_moves": 1, "max_moves": 2, "reverse_steps": 10}
        )
        assert 1 <= problem.data["optimal"] <= 2
    with pytest.raises(ValueError, match="max_moves"):
        SokobanEnv.Params(min_moves=3, max_moves=2)


@pytest.mark.parametrize("reply", ["\\boxed{}", "\\boxed{  }", "\\boxed{7 = 6}", "\\boxed{3 + 3 = 6}"])
def test_an_empty_box_or_a_relation_is_no_answer(reply):
    """An empty \\boxed{} earned the format term, and \\boxed{7 = 6} was graded as 6: neither states an answer."""
    from mas_lab.envs.math_task import stated_answer

    assert stated_answer(f"so the answer is {reply}") is None
    assert stated_answer("\\boxed{x = 6}") == "x = 6" and stated_answer("\\boxed{6}") == "6"


def test_a_plan_with_a_character_that_is_no_move_is_no_answer():
    """A fullwidth 'Ｕ' was dropped from a plan that still got full format credit."""
    from mas_lab.envs.plan_path import parse_answer_moves

    assert parse_answer_moves("Moves: Ｕ R") is None and parse_answer_moves("Moves: U R 2") is None
    assert parse_answer_moves("Moves: U, R.") == ["U", "R"] and parse_answer_moves("Moves: up right") == ["U", "R"]


def test_a_test_cannot_write_the_verdict_for_its_whole_batch():
    """Verdict laundering: one test that passes on the reference writes the verdict line for all
    tests and exits, so three tests that check nothing counted as meaningful (0.40 -> 1.00). Each
    test is judged in a process of its own, so it speaks only for itself."""
    vacuous = "\n".join(["assert remove_Occ('hello', 'l') is not None"] * 3)
    # passes on the reference, and writes "all passed" there and "all failed" against any other answer
    launder = (
        "assert _requests.write(_json.dumps({'verdict': [[remove_Occ('hello', 'l') == 'heo', True]] * 4}) + '\\n')"
        " and _requests.flush() is None and __import__('os')._exit(0)"
    )
    honest = as_tester(f"{vacuous}\nassert remove_Occ('hello', 'l') == 'heo'")
    laundered = as_tester(f"{vacuous}\n{launder}")
    assert laundered.local <= honest.local <= 0.2 + 0.8 * 0.25 + 1e-9


def test_three_perturbations_each_change_every_kind_of_answer():
    """Every way of changing an answer changes it (a test on the real answer rejects all three)."""
    from mas_lab.envs.code_judge import PERTURBATIONS, PERTURBED

    namespace: dict = {}
    exec(PERTURBED.format(reference=""), namespace)
    perturb = namespace["_mas_lab_perturb"]
    for value in (0, -1, 2.5, True, "", "a", "hello", b"ab", [], [1, 2], (3,), set(), {1, 2}, {}, {"a": 1}, None):
        for way in range(PERTURBATIONS):
            assert perturb(value, way) != value or type(perturb(value, way)) is not type(value), (value, way)
