"""A plugin that exits or hangs at import is reported as failed, never takes the CLI down with it
(`raise SystemExit(7)` made `mas-lab envs` and `mas-lab config` exit 7 silently; a sleeping import hung)."""

import re
import sys
from importlib.metadata import EntryPoint

import pytest

from mas_lab import envs
from mas_lab.envs import Registry


@pytest.mark.parametrize(
    "body, said",
    [
        ("raise SystemExit(7)", "exit(7)"),
        ("import time\ntime.sleep(60)", "did not finish in 0.5 s"),
        ("raise ValueError('bad')", "ValueError: bad"),
    ],
    ids=["exits", "hangs", "raises"],
)
def test_a_plugin_that_fails_at_import_is_reported(tmp_path, monkeypatch, body, said):
    module = f"plugin_{abs(hash(body))}"
    (tmp_path / f"{module}.py").write_text(body + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    point = EntryPoint(name="broken", value=f"{module}:Env", group=envs.ENTRY_POINTS)
    monkeypatch.setattr("importlib.metadata.entry_points", lambda group: [point])
    monkeypatch.setattr(envs, "PLUGIN_IMPORT_S", 0.5)
    registry = Registry({})
    assert "broken" not in registry
    assert said in registry.failed["broken"]
    sys.modules.pop(module, None)


@pytest.mark.parametrize(
    "reward, said",
    [
        (float("nan"), "reward team = nan is not a finite number"),
        (float("inf"), "reward team = inf is not a finite number"),
        (1e308, "reward team = 1e+308 is not a finite number of magnitude"),
        ("1.0", "reward team = '1.0' is not a number"),
    ],
    ids=["nan", "inf", "huge", "a string"],
)
def test_a_reward_the_learner_cannot_use_stops_with_the_env_the_role_and_the_value(reward, said):
    from mas_lab.envs.base import ActionResult, EnvError, Problem
    from mas_lab.envs.toy import ToyEnv

    class Broken(ToyEnv):
        def act(self, role, turn, action):
            return ActionResult(team=reward, local=0.0)

    env = Broken(Problem({"letters": "a"}), {})
    with pytest.raises(EnvError) as caught:
        env.step(env.roles[0], 0, "a")
    assert f"env 'Broken', role '{env.roles[0]}', turn 0: {said}" in str(caught.value)


def test_an_observation_that_is_not_text_or_too_long_stops_with_the_env_and_the_role():
    from mas_lab.envs.base import EnvError, Problem
    from mas_lab.envs.toy import ToyEnv

    class Dict(ToyEnv):
        def observe(self, role, turn):
            return {"grid": "..."}

    class Huge(ToyEnv):
        def observe(self, role, turn):
            return "x" * 2_000_000

    for cls, said in ((Dict, "observe() returned dict, not text"), (Huge, "an observation of 2000000 characters")):
        env = cls(Problem({"letters": "a"}), {})
        with pytest.raises(EnvError, match=re.escape(said)):
            env.messages(env.roles[0], 0)


def test_source_with_a_nul_byte_is_an_error_not_ok():
    """Python stopped reading at the NUL: the code after it never ran and the run said `ok`."""
    from mas_lab.sandbox.isolation import run_python

    result = run_python("print(1)\0\nraise SystemExit(3)")
    assert result.status == "error" and "NUL byte" in result.stderr and not result.ok


def test_a_prompt_longer_than_the_models_context_stops_with_the_env_and_the_role():
    """A prompt past the context trained without a word (rotary positions still sample). The run
    stops before anything is scored, stored or trained, naming the env, the role, the turn and the
    token counts; a prompt that fits runs as before."""
    from pathlib import Path

    from fakes import FakeEngine

    from mas_lab.config import load_task
    from mas_lab.envs import ProblemPool, ToyEnv
    from mas_lab.envs.base import EnvError
    from mas_lab.modeling import models
    from mas_lab.rollout.engine import Generation
    from mas_lab.training.episodes import Episode, tree_rollout

    models.resolve("tiny-test")
    assert models.context_length("tiny-test") == 2048
    assert models.context_length("no-such-model-folder") is None
    task = load_task(Path(__file__).parent.parent / "tasks" / "toy.yaml")
    pool = ProblemPool(ToyEnv, task.env.params, 0, 0)

    class LongPrompts(FakeEngine):
        def __init__(self, length):
            super().__init__()
            self.length = length

        def __call__(self, policy, prompts, n, sampling, seed):
            rows = super().__call__(policy, prompts, n, sampling, seed)
            return [[Generation([0] * self.length, g.response_ids, g.text) for g in row] for row in rows]

    new_tokens = task.roles[0].sampling.max_new_tokens
    fits = [Episode(0, pool.train(0), pool.make(pool.train(0)))]
    tree_rollout(task, fits, LongPrompts(2048 - new_tokens), task.algorithm.k, seed=0)
    assert fits[0].turns
    episodes = [Episode(0, pool.train(0), pool.make(pool.train(0)))]
    with pytest.raises(EnvError) as caught:
        tree_rollout(task, episodes, LongPrompts(2049 - new_tokens), task.algorithm.k, seed=0)
    said = str(caught.value)
    assert f"env 'ToyEnv', role '{task.roles[0].name}', turn 0" in said
    assert f"a prompt of {2049 - new_tokens} tokens plus max_new_tokens {new_tokens}" in said
    assert "context of 2048 tokens (tiny-test)" in said
    assert not episodes[0].turns  # nothing of the turn was recorded
