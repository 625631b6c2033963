"""The constant-answer baseline (mas_lab/training/baselines.py) and its place in the run's verdict."""

from mas_lab.analysis.reporting import verdict
from mas_lab.envs.base import Problem
from mas_lab.envs.plan_path import PlanPathEnv
from mas_lab.envs.toy import ToyEnv
from mas_lab.training.baselines import best_constant, solves


def _problem(start, goal):
    return Problem(
        {
            "grid": ["...", "...", "..."],
            "start": list(start),
            "goal": list(goal),
            "shortest": abs(goal[0] - start[0]) + abs(goal[1] - start[1]),
        }
    )


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
    above = verdict(
        before, {"success": 0.5, "ci": [0.38, 0.62]}, {"answer": "Moves: L", "success": 0.156, "ci": [0.087, 0.264]}
    )
    assert "above the best constant answer" in above and "not clearly" not in above
    flat = verdict(
        before, {"success": 0.03, "ci": [0.01, 0.1]}, {"answer": "Moves: L", "success": 0.156, "ci": [0.087, 0.264]}
    )
    assert "no clear change" in flat and "for comparison, the best constant answer ('Moves: L'" in flat


def test_an_evaluation_stores_the_constant_baseline_and_how_many_answers_differ(tmp_path):
    """A team that replies one fixed answer to every problem shows distinct_answers 1 and a success
    no higher than the stored best constant; the verdict names that constant."""
    from conftest import ROOT
    from fakes import FakeBackend, FakeEngine

    from mas_lab.config import load_task
    from mas_lab.records.store import RunStore
    from mas_lab.training.trainer import Trainer

    task = load_task(
        ROOT / "tasks" / "plan_path_learns.yaml", ["policies.shared.model=tiny-test", "train.eval_problems=32"]
    )
    trainer = Trainer(task, FakeBackend(FakeEngine(lambda c, n: "Moves: L")), RunStore(tmp_path / "run.db"))
    metrics = trainer.evaluate(0)
    best = trainer.constant
    assert metrics["eval/distinct_answers"] == 1.0
    assert best.problems == 32 and metrics["eval/constant_success"] == best.success
    assert metrics["eval/success_rate"] <= best.success
    assert metrics["eval/constant_ci_low"] <= best.success <= metrics["eval/constant_ci_high"]
    summary = trainer.summary()
    assert summary["constant"]["answer"] == best.answer


def test_a_single_agent_with_the_tool_counts_its_answers_not_its_programs(tmp_path):
    """tasks/plan_path_tool_single_tool.yaml: the agent's turn 0 is a program, its first answer
    comes at turn 1. A different program for every problem followed by one fixed answer is one
    first answer (before the fix every program counted)."""
    from conftest import ROOT
    from fakes import FakeBackend, FakeEngine

    from mas_lab.config import load_task
    from mas_lab.records.store import RunStore
    from mas_lab.training.trainer import Trainer

    overrides = ["policies.shared.model=tiny-test", "train.eval_problems=6", "train.hard_eval_problems=0"]
    task = load_task(ROOT / "tasks" / "plan_path_tool_single_tool.yaml", overrides)

    def reply(c, n, row):
        asked = engine.calls[-1]["prompts"][row][-1]["content"]
        return f"```python\nprint({row})\n```" if "Write the Python program" in asked else "Moves: L"

    engine = FakeEngine(reply)
    trainer = Trainer(task, FakeBackend(engine), RunStore(tmp_path / "run.db"))
    metrics = trainer.evaluate(0)
    asked = [m[-1]["content"] for call in engine.calls for m in call["prompts"]]
    assert sum("Write the Python program" in a for a in asked) >= 6  # six different programs were written
    assert metrics["eval/distinct_answers"] == 1.0


def test_the_reading_baseline_copies_the_letters_the_observation_states():
    import random

    from mas_lab.envs.plan_path import PlanPathEnv
    from mas_lab.training.baselines import reading_answers

    answers = reading_answers(
        "S (you) is at row 2, col 0; G is at row 0, col 1. G is 2 rows up (U U) and "
        "1 column right (R) of S.\nMoves: U (row-1), D (row+1), L (col-1), R (col+1)."
    )
    assert answers == {"sentence 1": "Moves: U U R", "sentence 1 swapped": "Moves: R U U"}
    params = {"size": 3, "wall_prob": 0.0, "min_distance": 1, "hint": "letters"}
    problem = PlanPathEnv.draw_problem(random.Random(2), params)
    env = PlanPathEnv(problem, params)
    stated = reading_answers(env.observe("planner", 0))["sentence 1"]
    assert env.step("planner", 0, stated).components["value"] == 1.0  # no walls: the straight way arrives


def _plan_path(grid, start, goal):
    from mas_lab.envs.base import Problem
    from mas_lab.envs.plan_path import PlanPathEnv, distances

    problem = Problem(
        {
            "grid": grid,
            "start": list(start),
            "goal": list(goal),
            "shortest": distances(grid, tuple(goal))[start[0]][start[1]],
        }
    )
    return PlanPathEnv, problem, PlanPathEnv.Params(size=len(grid), min_distance=1)


def test_the_reading_rules_on_hand_made_grids():
    """Rows first walks into the wall; either order goes round it by columns first; a wall that both
    straight ways meet needs a detour (the hard split), which only the optimum and stepping find."""
    from mas_lab.training.baselines import MOVE_RULES, play_rule, rule_results

    rules = {r.name: r for r in MOVE_RULES.rules}
    env_cls, blocked_rows, params = _plan_path([".#.", "...", "..."], (0, 0), (1, 1))
    assert play_rule(env_cls, blocked_rows, params, rules["rows_first"], 2) == (True, 2)  # D R: no wall in the way
    env_cls, corner, params = _plan_path(["...", "#..", "..."], (0, 0), (1, 1))
    assert play_rule(env_cls, corner, params, rules["rows_first"], 2)[0] is False  # D hits the wall
    assert play_rule(env_cls, corner, params, rules["either_order"], 2) == (True, 2)  # R D
    env_cls, detour, params = _plan_path([".#.", ".#.", "..."], (0, 0), (0, 2))
    results = rule_results(env_cls, params, [corner, detour], max_turns=2)
    assert results.solved["either_order"] == [True, False] and results.hard == [False, True]
    assert results.solved["optimum"] == [True, True] and results.moves["optimum"] == [2, 6]
    assert results.solved["one_step"] == [True, False]  # one move a turn: two turns are too few for the detour


def test_the_reading_rules_reproduce_the_issue_table_on_the_sample_runs_problems():
    """The held-out problems of `make run` (seed 0, 64): rows first 55, either order 63, one step a
    turn for two turns 45, as measured from the stores; one problem needs a detour."""
    from conftest import ROOT

    from mas_lab.config import load_task
    from mas_lab.envs import ENVS, ProblemPool
    from mas_lab.training.baselines import rule_results

    task = load_task(ROOT / "tasks" / "plan_path_learns.yaml")
    env_cls = ENVS["plan_path"]
    pool = ProblemPool(env_cls, task.env.params, 0, 64)
    results = rule_results(env_cls, pool.params, pool.eval_set, task.env.max_turns)
    assert {name: sum(s) for name, s in results.solved.items()} == {
        "rows_first": 55,
        "either_order": 63,
        "one_step": 45,
        "tool_first": 45,
        "optimum": 64,
    }
    assert sum(results.hard) == 1


def test_the_sokoban_push_rule_solves_an_open_room_and_fails_round_a_wall():
    from mas_lab.envs import SokobanEnv
    from mas_lab.envs.base import Problem
    from mas_lab.training.baselines import MOVE_RULES, play_rule

    rules = {r.name: r for r in MOVE_RULES.rules}
    grid = ["######", "#....#", "#....#", "#....#", "#....#", "######"]
    # box at (2, 2), target (4, 2): walk behind the box (row 1) and push down twice
    open_room = Problem({"grid": grid, "player": [1, 1], "boxes": [[2, 2]], "targets": [[4, 2]], "optimal": 0})
    params = SokobanEnv.Params()
    assert play_rule(SokobanEnv, open_room, params, rules["rows_first"], 1)[0]
    walled = Problem(
        {
            "grid": ["######", "#....#", "#.#..#", "#....#", "#....#", "######"],
            "player": [1, 1],
            "boxes": [[3, 2]],
            "targets": [[4, 2]],
            "optimal": 0,
        }
    )
    assert not play_rule(SokobanEnv, walled, params, rules["rows_first"], 1)[0]  # the wall stands between
    assert play_rule(SokobanEnv, walled, params, rules["optimum"], 1)[0]


def test_an_evaluation_stores_the_reading_rules_and_the_hard_split(tmp_path):
    """Beside the constant answer, every evaluation of a move game stores each reading rule's success
    with its interval, the optimum's move count and the hard split (extra hard problems when
    train.hard_eval_problems is set); the summary's verdict names the rules in words."""
    from conftest import ROOT
    from fakes import FakeBackend, FakeEngine

    from mas_lab.config import load_task
    from mas_lab.records.store import RunStore
    from mas_lab.training.trainer import Trainer

    task = load_task(
        ROOT / "tasks" / "plan_path.yaml",
        ["policies.shared.model=tiny-test", "train.eval_problems=16", "train.hard_eval_problems=8", "train.steps=0"],
    )
    trainer = Trainer(task, FakeBackend(FakeEngine(lambda c, n: "Moves: L")), RunStore(tmp_path / "run.db"))
    metrics = trainer.evaluate(0)
    for name in ("rows_first", "either_order", "one_step", "optimum"):
        low, high = metrics[f"eval/rule/{name}_ci_low"], metrics[f"eval/rule/{name}_ci_high"]
        assert low <= metrics[f"eval/rule/{name}"] <= high
    assert metrics["eval/rule/optimum"] == 1.0 and metrics["eval/optimum_moves"] >= 2
    assert metrics["eval/hard/problems"] == 8 and metrics["eval/hard/rule/either_order"] == 0.0
    assert len(trainer.store.episode_indices(0, "eval")) == 16 + 8
    assert (
        metrics["eval/success_rate"]
        == sum(
            e["success"] for e in trainer.store.rows("SELECT success FROM episodes WHERE kind = 'eval' AND idx < 16")
        )
        / 16
    )
    from mas_lab.analysis.evidence import run_evidence

    evidence = run_evidence(trainer.task, trainer.store, 0, held=trainer.held_out)
    optimum = evidence["baselines"]["the BFS optimum"]
    team = [e["success"] for e in trainer.store.rows("SELECT success FROM episodes WHERE kind = 'eval' AND idx < 16")]
    assert (optimum.n, optimum.a_only, optimum.b_only) == (16, 0, 16 - sum(team))
    assert any(label.startswith("the best constant answer") for label in evidence["baselines"])
    assert evidence["hard_problems"] == 8 and evidence["hard"]["the either-order reading rule"].b_only == 0


SOLVED_4X4 = [[1, 2, 3, 4], [3, 4, 1, 2], [2, 1, 4, 3], [4, 3, 2, 1]]


def test_the_single_candidate_rule_fills_forced_blanks_and_never_reads_the_solution():
    """Sudoku's reading rule: blanks whose row, column and box leave one digit, again and again. It
    reads the puzzle as given (the observation), never the stored solution: with the solution
    replaced it answers the same, and played through the environment it solves what it fills."""
    from mas_lab.envs.sudoku import SudokuEnv
    from mas_lab.training.baselines import SUDOKU_RULES, play_rule, rule_results, single_candidates

    puzzle = [row[:] for row in SOLVED_4X4]
    for r, c in [(0, 0), (0, 1), (1, 2), (2, 3), (3, 0), (3, 3)]:
        puzzle[r][c] = 0
    assert single_candidates(puzzle) == SOLVED_4X4
    assert puzzle[0][0] == 0  # the puzzle itself is left as it was
    # an empty grid forces nothing: the smallest digit still allowed, cell by cell, keeps it legal
    guessed = single_candidates([[0] * 4 for _ in range(4)])
    assert guessed[0] == [1, 2, 3, 4] and all(1 <= v <= 4 for row in guessed for v in row)
    params = SudokuEnv.Params(size=4)
    rule = SUDOKU_RULES.rules[0]
    solvable = Problem({"puzzle": puzzle, "solution": SOLVED_4X4})
    garbled = Problem({"puzzle": puzzle, "solution": [[1] * 4 for _ in range(4)]})
    assert rule.plan(SudokuEnv(solvable, params)) == rule.plan(SudokuEnv(garbled, params))
    assert play_rule(SudokuEnv, solvable, params, rule, 1)[0]
    assert not play_rule(SudokuEnv, garbled, params, rule, 1)[0]  # success is the env's
    results = rule_results(SudokuEnv, params, [solvable, garbled], max_turns=2)
    assert results.solved == {"single_candidates": [True, False]}
    assert results.hard_rule is None and results.hard == [False, False]  # Sudoku has no hard split


def test_a_sudoku_evaluation_stores_the_single_candidate_rule_without_a_hard_split(tmp_path):
    from conftest import ROOT
    from fakes import FakeBackend, FakeEngine

    from mas_lab.analysis.evidence import run_evidence
    from mas_lab.config import load_task
    from mas_lab.records.store import RunStore
    from mas_lab.training.trainer import Trainer

    task = load_task(
        ROOT / "tasks" / "sudoku.yaml", ["policies.shared.model=tiny-test", "train.eval_problems=8", "train.steps=0"]
    )
    trainer = Trainer(task, FakeBackend(FakeEngine(lambda c, n: "Grid:\n1 1 1 1")), RunStore(tmp_path / "run.db"))
    metrics = trainer.evaluate(0)
    rule = metrics["eval/rule/single_candidates"]
    assert metrics["eval/rule/single_candidates_ci_low"] <= rule <= metrics["eval/rule/single_candidates_ci_high"]
    assert rule == 1.0  # forced cells alone solve every 4x4 puzzle with half its cells blank
    assert not any(key.startswith("eval/hard/") for key in metrics) and "eval/optimum_moves" not in metrics
    verdicts = run_evidence(task, trainer.store, 0)["baselines"]
    rule_verdict = verdicts["the single-candidate rule"]
    assert rule_verdict.b_only == 8 - sum(e["success"] for e in trainer.store.rows("SELECT success FROM episodes"))
    events = trainer.store.rows("SELECT message FROM events WHERE kind = 'eval'")
    assert "single_candidates" in events[-1]["message"]


def test_the_run_verdict_follows_the_paired_tests():
    """Words come from the paired test on the same problems, never from overlapping intervals."""
    from mas_lab.analysis.paired import compare_paired
    from mas_lab.analysis.reporting import paired_verdict

    def outcomes(both, a_only, b_only, neither):
        return [True] * (both + a_only) + [False] * (b_only + neither), [True] * both + [False] * a_only + [
            True
        ] * b_only + [False] * neither

    evidence = {
        "problems": 64,
        "change": compare_paired([outcomes(3, 41, 0, 20)]),
        "baselines": {
            "the best constant answer": compare_paired([outcomes(10, 34, 0, 20)]),
            "the rows-first reading rule": compare_paired([outcomes(44, 0, 11, 9)]),
            "one legal move toward the goal per turn": compare_paired([outcomes(44, 0, 1, 19)]),
        },
    }
    said = paired_verdict({"success": 3 / 64}, {"success": 44 / 64}, evidence)
    assert said.startswith("held-out success 0.047 -> 0.688 on the same 64 problems: better after training (n=64")
    assert "above the best constant answer (n=64, discordant 34/0" in said
    assert "below the rows-first reading rule (n=64, discordant 0/11" in said
    assert "not distinguishable from one legal move toward the goal per turn (n=64, discordant 0/1" in said
    assert "level with" not in said
