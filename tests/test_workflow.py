"""Workflows in the task file (env.params.workflow, mas_lab/envs/games.py): the built-in game tasks
run on the declared workflow with exactly the groups they had before it existed (digests pinned from
the code before the change), a changed workflow changes them, and a three-role team (tool, planner,
verifier) samples, scores and trains with every group checked."""

import dataclasses
import hashlib
import json

import pytest
from conftest import ROOT, run_task
from fakes import FakeEngine

from mas_lab.algo.credit import Credit
from mas_lab.config import TaskFileError, load_task
from mas_lab.envs import ENVS, PlanPathEnv, ProblemPool
from mas_lab.training.episodes import Episode, tree_rollout
from mas_lab.training.trainer import compute_advantages

REPLIES = [
    "```python\nprint(['R', 'D'])\n```",
    "```python\nprint(solve(['S.', '.G']))\n```",
    "Moves: R D",
    "Moves: U",
    "```python\nprint('no moves')\n```",
    "nonsense",
]
# sha256 of every group member of the scripted rollouts below, computed with the code before
# workflows existed (commit 8d5d8cc, games.py with the tool -> planner protocol written out)
BEFORE = {
    "plan_path": "b7e862a0c29d3ecc5b52bfce20e4f06d47b139c11e08e53143949de5046e8adc",
    "plan_path_solver": "47e2e70903defde1723ca038038c33dde274a6de267c8d74cf84d1a25dfd7847",
    "sokoban": "e4dbf2f043f3854b7cdc62b357b4bdb2f7131c735746724d70e1c6cf6b8842c7",
    "sudoku": "b9cf03f0d4d28db50a08f1538adc1799429fd8d02579d8bbd8af1e5d05846a4e",
}
CASES = {
    "plan_path": ("tasks/plan_path_tiny.yaml", ["algorithm.k=4", "env.max_turns=3"]),
    "plan_path_solver": ("tasks/plan_path_tool.yaml", ["policies.shared.model=tiny-test", "train.warmup_steps=0"]),
    "sokoban": ("tasks/sokoban_tiny.yaml", ["algorithm.k=4"]),
    "sudoku": ("tasks/sudoku_tiny.yaml", ["algorithm.k=4"]),
}
DEFAULT = json.dumps([{"role": "tool", "kind": "program"}, {"role": "planner", "kind": "answer", "sees": ["tool"]}])


def script(c, n, row):
    return REPLIES[(c + 2 * row) % len(REPLIES)]


def rollout(task_file, overrides, problems=4):
    task = load_task(ROOT / task_file, overrides)
    env_cls = ENVS[task.env.name]
    pool = ProblemPool(env_cls, task.env.params, 0, 4)
    episodes = [Episode(i, pool.train(i), pool.make(pool.train(i))) for i in range(problems)]
    tree_rollout(task, episodes, FakeEngine(script), task.algorithm.k, seed=0)
    credit = dataclasses.replace(Credit.of(task.algorithm, task.roles), tree=True)  # the rollout above is the tree
    return task, episodes, compute_advantages(episodes, task.algorithm.advantage, credit)


def digest(groups) -> str:
    rows = [
        [m.problem_id, m.role, m.turn, m.index, m.prompt_hash, m.response, m.reward, m.team, m.local,
         sorted(m.components.items()), m.advantage, m.chosen, m.state_after]
        for g in groups
        for m in g.members
    ]  # fmt: skip
    return hashlib.sha256(json.dumps(rows, default=str).encode()).hexdigest()


@pytest.mark.parametrize("case", list(CASES))
def test_the_built_in_games_keep_their_groups_on_the_declared_workflow(case):
    task_file, overrides = CASES[case]
    assert digest(rollout(task_file, overrides)[2]) == BEFORE[case]  # no workflow given: the default
    declared = [*overrides, f"env.params.workflow={DEFAULT}"]
    assert digest(rollout(task_file, declared)[2]) == BEFORE[case]  # the default written out


def test_a_changed_workflow_changes_what_is_seen_and_rewarded():
    task_file, overrides = CASES["plan_path_solver"]
    blind = json.dumps([{"role": "tool", "kind": "program"}, {"role": "planner", "kind": "answer"}])
    _, episodes, groups = rollout(task_file, [*overrides, f"env.params.workflow={blind}"])
    assert digest(groups) != BEFORE["plan_path_solver"]
    planner = next(t for t in episodes[0].turns if t.role == "planner")
    assert "The tool agent's code" not in planner.observation  # it sees nothing of the tool
    weighted = json.dumps(
        [
            {"role": "tool", "kind": "program", "weights": {"value": 1.0}},
            {"role": "planner", "kind": "answer", "sees": ["tool"]},
        ]
    )
    _, episodes, _ = rollout(task_file, [*overrides, f"env.params.workflow={weighted}"])
    for turn in (t for e in episodes for t in e.turns if t.role == "tool"):
        assert all(c.local == c.components["value"] for c in turn.candidates)  # ran and parsed weigh 0


@pytest.mark.parametrize(
    "workflow, message",
    [
        ([{"role": "tool", "kind": "program"}], "no answer role"),
        ([{"role": "a", "kind": "answer", "sees": ["b"]}], "a sees 'b'; allowed: []"),
        ([{"role": "a", "kind": "answer"}, {"role": "a", "kind": "answer"}], "role names repeat"),
        ([{"role": "a", "kind": "answer", "weights": {"ran": 1}}], "unknown ['ran']; allowed: ['format', 'value']"),
        ([{"role": "solver", "kind": "answer"}], "single-agent baseline's role"),
        (
            [{"role": "a", "kind": "program_then_answer"}, {"role": "b", "kind": "answer", "sees": ["a"]}],
            "b sees 'a', a program_then_answer role",
        ),
        ([{"role": "a", "kind": "program_then_answer", "weights": {"cost": 1}}], "allowed: ['format', 'parsed'"),
    ],
)
def test_a_wrong_workflow_names_the_field(workflow, message):
    with pytest.raises(TaskFileError, match="env.params.workflow") as error:
        load_task(ROOT / "tasks" / "plan_path_tiny.yaml", [f"env.params.workflow={json.dumps(workflow)}"])
    assert message in str(error.value)


def test_the_roles_must_follow_the_workflow():
    with pytest.raises(TaskFileError, match=r"has roles \['tool', 'planner', 'verifier'\] in this order"):
        load_task(ROOT / "tasks" / "plan_path_verifier.yaml", ["roles.2.name=checker"])


def test_a_three_role_team_sees_what_its_workflow_says_and_keeps_its_groups():
    overrides = ["policies.shared.model=tiny-test", "train.warmup_steps=0"]
    task, episodes, groups = rollout("tasks/plan_path_verifier.yaml", overrides, problems=6)
    assert [r.name for r in task.roles] == ["tool", "planner", "verifier"]
    assert {g.key.role for g in groups} == {"tool", "planner", "verifier"}
    assert all(len(g.members) == 4 and len({m.prompt_hash for m in g.members}) == 1 for g in groups)
    for episode in episodes:
        turns = episode.turns
        for i, turn in enumerate(turns):
            if turn.role != "verifier":
                continue
            planner = turns[i - 1]
            assert planner.role == "planner" and not planner.candidates[planner.chosen].team >= 1.0
            chosen_reply = planner.candidates[planner.chosen].response
            assert f"The planner's reply:\n{chosen_reply.strip()}" in turn.observation
            assert "The tool agent's code" in turn.observation
            assert turn.system.startswith("You are the verifier.")
    verifier_turns = [t for e in episodes for t in e.turns if t.role == "verifier"]
    assert verifier_turns, "the scripted planner never fails: the verifier would not be exercised"
    env = PlanPathEnv(episodes[0].problem, task.env.params)
    assert env.format_demo("verifier", __import__("random").Random(0)).startswith("Moves: ")


@pytest.mark.integration
def test_a_three_role_team_trains_from_the_cli(tmp_path):
    """Two steps of the three-role task with the tiny model: a real run (in-process actors), its
    stored groups one per (problem, role, turn) with K members, the per-role gradient norms logged."""
    summary, store = run_task(
        tmp_path,
        "plan_path_verifier.yaml",
        "--no-ray",
        sets=(
            *("policies.shared.model=tiny-test", "policies.shared.dtype=float32"),
            *("train.steps=2", "train.warmup_steps=1", "train.problems_per_step=3"),
            *("train.eval_problems=4", "train.hard_eval_problems=0", "train.eval_every=0"),
            *("algorithm.filter=none", "resources.torch_threads=1"),
        ),
    )
    groups = store.group_table()
    assert {g["role"] for g in groups} >= {"tool", "planner"}
    assert all(g["n"] == 4 for g in groups)
    keys = [(g["step"], g["problem_id"], g["role"], g["turn"]) for g in groups]
    assert len(keys) == len(set(keys))
    metrics = store.metrics()
    assert any(k.startswith("grad_norm_role/") for m in metrics.values() for k in m)
    # the replay screen walks the three agents of a turn where the verifier acted
    import asyncio

    from tui.app import MasLabApp

    verifier = store.rows(
        "SELECT e.step, e.idx FROM turns t JOIN episodes e ON t.episode_id = e.id "
        "WHERE t.role = 'verifier' AND e.kind = 'train' ORDER BY e.step, e.idx LIMIT 1"
    )
    if not verifier:
        pytest.skip("the tiny model's planner solved every problem: no verifier turn to replay")
    at = {"kind": "train", "step": verifier[0]["step"], "episode": verifier[0]["idx"]}

    async def go():
        app = MasLabApp(tmp_path / summary["run_dir"], "replay", replay_at=at)
        async with app.run_test(size=(150, 50)) as pilot:
            await pilot.pause()
            seen = [str(app.screen.query_one("#where").render())]
            for _ in range(2):
                await pilot.press("l")
                seen.append(str(app.screen.query_one("#where").render()))
            return seen

    where = asyncio.run(go())
    assert [next(r for r in ("tool", "planner", "verifier") if f"agent {r}" in w) for w in where] == [
        "tool",
        "planner",
        "verifier",
    ]


def test_a_single_agent_with_the_tool_writes_a_program_then_answers_from_its_output():
    """tasks/plan_path_tool_single_tool.yaml: one role of kind program_then_answer over 4 turns. At
    turns 0 and 2 it is scored as the tool agent (ran, parsed, value on a trial copy; the live state
    does not move), at turns 1 and 3 it reads its own code and output and its answer moves the state,
    as the planner's does. Its rules and hard split play its two answer turns: the team's problems."""
    import random

    from mas_lab.training.baselines import answer_turns, task_pool

    overrides = ["policies.shared.model=tiny-test", "train.warmup_steps=0"]
    task = load_task(ROOT / "tasks" / "plan_path_tool_single_tool.yaml", overrides)
    team = load_task(ROOT / "tasks" / "plan_path_tool.yaml", overrides)
    assert (answer_turns(task), answer_turns(team)) == (2, 2)
    mine, theirs = task_pool(task), task_pool(team)
    assert [p.id for p in mine.eval_set] == [p.id for p in theirs.eval_set]
    assert [p.id for p in mine.hard_set] == [p.id for p in theirs.hard_set]

    env = mine.make(mine.eval_set[0])
    assert env.demo_turns("agent") == (0, 1)
    program, answer = env.format_demo("agent", random.Random(0), 0), env.format_demo("agent", random.Random(0), 1)
    assert program.startswith("```python") and answer.startswith("Moves: ")
    start = env.render()
    assert "Write the Python program" in env.observe("agent", 0)
    tool = env.step("agent", 0, program)
    assert set(tool.components) == {"ran", "parsed", "value"} and tool.components["value"] == 1.0
    assert env.render() == start and not env.success  # a program moves nothing
    seen = env.observe("agent", 1)
    assert f"Your program:\n```python\n{program.removeprefix('```python').removesuffix('```').strip()}" in seen
    assert f"Its output:\n{env.tool_output.strip()}" in seen and "Moves:" in seen
    plan = env.tool_output.strip()
    moves = "Moves: " + " ".join(eval(plan))  # noqa: S307 - solve()'s printed list
    done = env.step("agent", 1, moves)
    assert set(done.components) == {"format", "value"} and done.team == 1.0 and env.success

    _, episodes, groups = rollout("tasks/plan_path_tool_single_tool.yaml", overrides)
    for episode in episodes:
        for turn in episode.turns:
            kind = {"ran", "parsed", "value"} if turn.turn % 2 == 0 else {"format", "value"}
            assert all(set(c.components) == kind for c in turn.candidates), (turn.turn, turn.candidates[0].components)
    assert {len(g.members) for g in groups} == {task.algorithm.k}  # the scripted tree: K candidates a group
    assert {g.key.role for g in groups} == {"agent"}


@pytest.mark.integration
def test_a_single_agent_with_the_tool_warms_up_on_both_kinds_and_trains(tmp_path):
    """A real run (tiny model, in-process actors): the warm-up trains one program and one answer
    demonstration per problem, and training stores turns of both kinds."""
    summary, store = run_task(
        tmp_path,
        "plan_path_tool_single_tool.yaml",
        "--no-ray",
        sets=(
            *("policies.shared.model=tiny-test", "policies.shared.dtype=float32"),
            *("train.steps=1", "train.warmup_steps=1", "train.problems_per_step=2"),
            *("train.eval_problems=2", "train.hard_eval_problems=0", "train.eval_every=0"),
            *("algorithm.filter=none", "resources.torch_threads=1"),
        ),
    )
    try:
        warmup = [e["message"] for e in store.events() if e["kind"] == "warmup"]
        assert len(warmup) == 1 and "nll/shared" in warmup[0]
        turns = store.turn_table()
        assert {t["turn"] for t in turns if t["kind"] == "train"} >= {0, 1}
        assert summary["steps"] == 1
    finally:
        store.close()
