"""The constant-answer baseline (mas_lab/baselines.py) and its place in the run's verdict."""
from mas_lab.baselines import best_constant, solves
from mas_lab.controller import verdict
from mas_lab.envs.base import Problem
from mas_lab.envs.plan_path import PlanPathEnv
from mas_lab.envs.toy import ToyEnv


def _problem(start, goal):
    return Problem({"grid": ["...", "...", "..."], "start": list(start), "goal": list(goal),
                    "shortest": abs(goal[0] - start[0]) + abs(goal[1] - start[1])})


def test_the_best_constant_is_the_answer_that_solves_most_problems():
    problems = [_problem((1, 1), (1, 2)), _problem((0, 0), (0, 1)), _problem((2, 2), (1, 2))]  # R, R, U
    params = PlanPathEnv.Params.coerce({})
    assert solves(PlanPathEnv, problems[0], params, "Moves: R", 1)
    assert not solves(PlanPathEnv, problems[2], params, "Moves: R", 1)
    assert solves(PlanPathEnv, _problem((0, 0), (0, 2)), params, "Moves: R", 2)  # the same answer on two turns
    best = best_constant(PlanPathEnv, params, problems, max_turns=1)
    assert (best.answer, best.solved, best.problems) == ("Moves: R", 2, 3)
    assert abs(best.success - 2 / 3) < 1e-12


def test_an_env_without_constant_answers_has_no_baseline():
    assert best_constant(ToyEnv, ToyEnv.Params.coerce({}), [], 1) is None


def test_the_verdict_compares_with_the_best_constant_answer():
    before = {"success": 0.0, "ci": [0.0, 0.057]}
    after = {"success": 0.16, "ci": [0.087, 0.264]}
    plain = verdict(before, after)
    assert "better after training" in plain and "constant" not in plain
    below = verdict(before, after, {"answer": "Moves: L", "success": 0.156, "ci": [0.087, 0.264]})
    assert "better after training" in below and "not clearly above" in below and "Moves: L" in below
    above = verdict(before, {"success": 0.5, "ci": [0.38, 0.62]}, {"answer": "Moves: L", "success": 0.156, "ci": [0.087, 0.264]})
    assert "above the best constant answer" in above and "not clearly" not in above
    flat = verdict(before, {"success": 0.03, "ci": [0.01, 0.1]}, {"answer": "Moves: L", "success": 0.156, "ci": [0.087, 0.264]})
    assert "no clear change" in flat and "for comparison, the best constant answer ('Moves: L'" in flat


def test_an_evaluation_stores_the_constant_baseline_and_how_many_answers_differ(tmp_path):
    """A team that replies one fixed answer to every problem shows distinct_answers 1 and a success
    no higher than the stored best constant; the verdict names that constant."""
    from conftest import ROOT
    from fakes import FakeBackend, FakeEngine
    from mas_lab.config import load_task
    from mas_lab.controller import Controller
    from mas_lab.store import RunStore

    task = load_task(ROOT / "tasks" / "plan_path_learns.yaml", ["policies.shared.model=tiny-test", "train.eval_problems=32"])
    controller = Controller(task, FakeBackend(FakeEngine(lambda c, n: "Moves: L")), RunStore(tmp_path / "run.db"))
    metrics = controller.evaluate(0)
    best = controller.constant
    assert metrics["eval/distinct_answers"] == 1.0
    assert best.problems == 32 and metrics["eval/constant_success"] == best.success
    assert metrics["eval/success_rate"] <= best.success
    assert metrics["eval/constant_ci_low"] <= best.success <= metrics["eval/constant_ci_high"]
    summary = controller.summary()
    assert summary["constant"]["answer"] == best.answer


def test_the_reading_baseline_copies_the_letters_the_observation_states():
    import random

    from conftest import load_benchmark
    from mas_lab.envs.plan_path import PlanPathEnv

    reading = load_benchmark("reading_baseline")
    answers = reading.reading_answers("S (you) is at row 2, col 0; G is at row 0, col 1. G is 2 rows up (U U) and "
                                      "1 column right (R) of S.\nMoves: U (row-1), D (row+1), L (col-1), R (col+1).")
    assert answers == {"sentence 1": "Moves: U U R", "sentence 1 swapped": "Moves: R U U"}
    problem = PlanPathEnv.draw_problem(random.Random(2), {"size": 3, "wall_prob": 0.0, "min_distance": 1})
    env = PlanPathEnv(problem, {"size": 3, "wall_prob": 0.0, "min_distance": 1})
    stated = reading.reading_answers(env.observe("planner", 0))["sentence 1"]
    assert env.step("planner", 0, stated).components["value"] == 1.0  # no walls: the straight way arrives
