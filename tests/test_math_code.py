"""Math and code tasks: grading edge cases, rewards, parallel turns, golden tests in the sandbox."""

import json

import pytest
from conftest import ROOT
from fakes import FakeEngine

from mas_lab.config import TaskFileError, load_task
from mas_lab.envs import CodeEnv, MathEnv, ProblemPool
from mas_lab.envs.base import Problem
from mas_lab.envs.code_task import golden_verdict, split_tests
from mas_lab.envs.datasets import code_problems, last_boxed, math_problems
from mas_lab.envs.math_grading import grade
from mas_lab.training.episodes import Episode, tree_rollout

# MBPP's task 927 needs tree objects that its test_setup_code does not define in this package
KNOWN_BROKEN = {("mbpp", 356)}


@pytest.mark.parametrize(
    "gold,predicted,expected",
    [
        ("\\frac{1}{2}", "0.5", True),
        ("\\frac{1}{2}", "\\dfrac12", True),
        ("\\frac{1}{2}", "1/2", True),
        ("(0,1]", "(0,1]", True),
        ("(0,1]", "[0,1]", False),
        ("5", "5 \\text{ cm}", True),
        ("5", "5\\text{cm}", True),
        ("\\left(3,\\frac{\\pi}{2}\\right)", "(3,\\frac{\\pi}{2})", True),
        ("1000", "1,000", True),
        ("1000", "1{,}000", True),
        ("x^2+1", "1+x^2", True),
        ("2", "3", False),
        ("2", None, False),
        ("2", "", False),
    ],
)
def test_math_grading_edge_cases(gold, predicted, expected):
    assert grade(predicted, gold) is expected


def test_last_boxed_matches_braces():
    assert (
        last_boxed("so \\boxed{\\frac{1}{2}} and finally \\boxed{\\left(3,\\frac{\\pi}{2}\\right)}")
        == "\\left(3,\\frac{\\pi}{2}\\right)"
    )
    assert last_boxed("no answer") is None


def test_packaged_data_sets_and_disjoint_splits():
    assert len(math_problems("math500")) == 500 and len(math_problems("gsm8k")) == 1319
    train = {p["problem"] for p in math_problems("math_train")}
    assert len(train) >= 4400 and not train & {p["problem"] for p in math_problems("math500")}
    assert math_problems("gsm8k")[0]["answer"] == "18"
    pool = ProblemPool(MathEnv, {}, seed=0, eval_size=20)
    hashes = {p.content_hash for p in pool.eval_set}
    assert not hashes & {pool.train(i).content_hash for i in range(200)}


@pytest.mark.slow
def test_every_golden_solution_passes_its_golden_tests_in_the_sandbox():
    from concurrent.futures import ThreadPoolExecutor

    def passes(item):  # each judge waits on two sandboxed processes: a few at a time
        name, i, record = item
        verdict = golden_verdict(record, record["solution"])
        return None if all(verdict.passed) and all(verdict.exercised) else (name, i)

    items = [(name, i, record) for name in ("humaneval", "mbpp") for i, record in enumerate(code_problems(name))]
    with ThreadPoolExecutor(max_workers=4) as pool:
        failing = [found for found in pool.map(passes, items) if found is not None]
    print(f"golden solutions failing their tests: {failing}")
    assert set(failing) <= KNOWN_BROKEN


def math_problem(answer="12"):
    return Problem({"problem": "What is 3 * 4?", "answer": answer})


def test_math_rewards_and_agreement():
    env = MathEnv(math_problem(), {})
    reasoner = env.clone().step("reasoner", 0, "3 * 4 = 12, so \\boxed{12}")
    assert (
        reasoner.local == pytest.approx(1.0)
        and reasoner.team == 1.0
        and reasoner.components == {"format": 1.0, "match": 1.0}
    )
    tool = env.clone().step("tool", 0, "```python\nprint(3 * 4)\n```")
    assert tool.local == pytest.approx(1.0) and tool.components == {"builds": 1.0, "executes": 1.0, "match": 1.0}
    broken = env.clone().step("tool", 0, "```python\nprint(3 *\n```")
    assert broken.components["builds"] == 0.0 and broken.local == 0.0
    wrong = env.clone().step("reasoner", 0, "\\boxed{13}")
    assert wrong.local == pytest.approx(0.2) and wrong.team == 0.0
    env.step("reasoner", 0, "\\boxed{12}")
    assert not env.done
    env.step("tool", 0, "```python\nprint(12)\n```")
    assert env.done and env.success


def test_math_agents_of_a_turn_observe_its_start_state(tmp_path):
    data = tmp_path / "tiny.jsonl"
    data.write_text("\n".join(json.dumps({"problem": f"What is {i} + {i}?", "answer": str(2 * i)}) for i in range(30)))
    task = load_task(
        ROOT / "tasks" / "math_tiny.yaml", [f"env.params.train={data}", "env.params.eval=math500", "algorithm.k=2"]
    )
    answers = {0: "\\boxed{1}", 1: "\\boxed{2}"}
    pool = ProblemPool(MathEnv, task.env.params, 0, 0)
    episodes = [Episode(i, pool.train(i), pool.make(pool.train(i))) for i in range(3)]
    tree_rollout(task, episodes, FakeEngine(lambda c, n: answers[c]), 2, seed=0)
    for episode in episodes:
        turn0 = [t for t in episode.turns if t.turn == 0]
        assert [t.role for t in turn0] == ["reasoner", "tool"]
        assert "Answers so far" not in turn0[1].observation  # the tool did not see the reasoner's turn-0 answer
        later = [t for t in episode.turns if t.turn == 1]
        if later:
            assert all("Answers so far" in t.observation and "reasoner:" in t.observation for t in later)


def test_missing_local_data_file_is_a_clear_task_file_error():
    with pytest.raises(TaskFileError, match="math_tiny.yaml: field 'env.params': no such data file '/nope.jsonl'"):
        load_task(ROOT / "tasks" / "math_tiny.yaml", ["env.params.train=/nope.jsonl"])


def test_code_rewards_for_coder_and_tester():
    record = code_problems("mbpp")[0]
    env = CodeEnv(Problem(dict(record)), {})
    coder = env.clone().step("coder", 0, f"```python\n{record['solution']}\n```")
    assert coder.team == 1.0 and coder.local == pytest.approx(1.0)
    wrong = env.clone().step("coder", 0, "```python\ndef remove_Occ(s, ch):\n    return s\n```")
    assert wrong.team == 0.0 and wrong.components["builds"] == 1.0
    tests = "\n".join(record["tests"])
    tester = env.clone().step("tester", 0, f"```python\n{tests}\n```")
    assert tester.components == {"valid": 1.0, "reference_pass": 1.0}
    bad_tests = env.clone().step("tester", 0, "```python\nassert remove_Occ('abc', 'b') == 'xyz'\n```")
    assert bad_tests.components["reference_pass"] == 0.0 and bad_tests.local == pytest.approx(0.2)
    assert split_tests("```python\nx = 1\nassert f(1) == 2\nassert f(2) == 3\n```") == [
        "assert f(1) == 2",
        "assert f(2) == 3",
    ]
    env.step("coder", 0, f"```python\n{record['solution']}\n```")
    env.step("tester", 0, f"```python\n{tests}\n```")
    assert env.done and env.success


def test_the_team_reward_is_the_live_states_after_a_parallel_turn(tmp_path):
    """Math, one turn: the reasoner answers right, the tool's program prints a wrong number. The
    live state takes both actions (the reasoner's answer is the team's) and succeeds; the metric
    read the last agent's branch, which holds only the tool's answer, and said 0.0."""
    from mas_lab.analysis.reporting import reward_metrics

    data = tmp_path / "one.jsonl"
    data.write_text("\n".join(json.dumps({"problem": f"What is {i} + {i}?", "answer": str(2 * i)}) for i in range(30)))
    task = load_task(
        ROOT / "tasks" / "math_tiny.yaml", [f"env.params.train={data}", "env.params.eval=math500", "env.max_turns=1"]
    )
    pool = ProblemPool(MathEnv, task.env.params, 0, 0)
    problems = [pool.train(i) for i in range(2)]

    def answers(c, n, row):
        gold = problems[row].data["answer"]
        return f"\\boxed{{{gold}}}" if c % 2 == 0 else "```python\nprint(-1)\n```"

    episodes = [Episode(i, p, pool.make(p)) for i, p in enumerate(problems)]
    reasoner_first = FakeEngine(lambda c, n, row: answers(0, n, row))
    tool_next = FakeEngine(lambda c, n, row: answers(1, n, row))
    calls = iter([reasoner_first, tool_next])
    tree_rollout(task, episodes, lambda *args: next(calls)(*args), 1, seed=0)
    assert all(e.success for e in episodes)
    assert all(e.turns[-1].role == "tool" and e.turns[-1].candidates[0].team == 0.0 for e in episodes)
    assert reward_metrics(episodes)["team_reward"] == 1.0
