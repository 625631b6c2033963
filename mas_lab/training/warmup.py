"""The format warm-up (`train.warmup_steps`): supervised steps on replies in each role's answer
format with random content, before the first evaluation (mas-lab's addition for small models; the
paper starts RL from the instruct model)."""

from __future__ import annotations

import hashlib
import json
import random
from typing import Callable

from mas_lab.actors.backend import PolicyBackend
from mas_lab.config import TaskConfig
from mas_lab.envs import Env, Problem
from mas_lab.learner.samples import Sample
from mas_lab.modeling.models import resolve
from mas_lab.records.provenance import code_version
from mas_lab.records.store import RunStore
from mas_lab.rollout.engine import encode_chat
from mas_lab.training.episodes import call_seed, with_system


def format_warm_up(
    task: TaskConfig,
    backend: PolicyBackend,
    store: RunStore,
    next_problems: Callable[[], list[Problem]],
    make_env: Callable[[Problem], Env],
) -> None:
    """The format warm-up (`train.warmup_steps`), before the first evaluation: each step takes
    the next problems_per_step training problems and, for every role, a reply in its answer
    format with random content (`Env.format_demo`: never read from the problem), and trains
    each policy on its roles' replies with advantage 1 (on-policy, so the clipped objective's
    gradient is the log-likelihood's: one supervised step). It teaches a small model the form
    of an answer so that GRPO has legal, differing candidates to compare; what it cannot teach
    is which moves solve a problem. The evaluation at step 0 comes after it, so a run's lift is
    the RL's alone. Logged as an event per step with each policy's mean -log p of the replies
    before that step's update."""

    # lazy: transformers (and torch), only when a model or tokenizer is built
    from transformers import AutoTokenizer

    by_model = {
        model: AutoTokenizer.from_pretrained(resolve(model)) for model in {p.model for p in task.policies.values()}
    }
    tokenizers = {name: by_model[policy.model] for name, policy in task.policies.items()}
    rng = random.Random(call_seed(task.train.seed, "warmup"))
    roles = [r.name for r in task.roles]
    for i in range(task.train.warmup_steps):
        samples: dict[str, list[Sample]] = {name: [] for name in task.policies}
        for problem in next_problems():
            env = make_env(problem)
            for role in roles:
                policy = task.policy_of(role)
                tokenizer = tokenizers[policy]
                for turn in env.demo_turns(role):  # a program-then-answer agent: one of each
                    reply = env.format_demo(role, rng, turn) if turn else env.format_demo(role, rng)
                    response = tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.eos_token_id]
                    messages = with_system(env.messages(role, turn), task.role(role).system_prompt)
                    sample = Sample(encode_chat(tokenizer, messages), response, 1.0, demonstration=True)
                    samples[policy].append(sample)
        updates = backend.update(samples)
        store.event(
            0,
            "warmup",
            f"format warm-up step {i + 1}/{task.train.warmup_steps}: "
            + ", ".join(f"nll/{n} {u['nll']:.3f}" for n, u in updates.items()),
        )
    backend.sync_weights(0)


# What the warm-up never reads (format_warm_up reads the roles, their policies and prompts, the env,
# the seed, the problems, the warm-up's length and the learner's update settings): two runs that
# differ only here warm up identically, so they may share one warm-up (train.warmup_cache). Kept
# short on purpose: a setting left out only costs a second warm-up, one wrongly listed would change
# a run silently (tests/test_learning.py checks a shared warm-up against a run's own, step by step).
WARMUP_FREE = (
    "algorithm.advantage",
    "algorithm.mode",
    "algorithm.counterfactual_credit",
    "algorithm.gigpo_episode",
    "train.steps",
    "train.eval_every",
    "train.warmup_cache",
    "tracking",
    "checkpoint",
)


def warmup_fingerprint(task: TaskConfig) -> str:
    """The format warm-up's inputs as one hash: the resolved task without WARMUP_FREE, and the
    mas_lab code (another code may warm up differently)."""
    data = task.model_dump(mode="json")
    for dotted in WARMUP_FREE:
        *parents, key = dotted.split(".")
        node = data
        for part in parents:
            node = node.get(part, {})
        node.pop(key, None)
    text = json.dumps({"task": data, "code": code_version()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
