"""Tree sampling over a batch of environments: the inner loops of Algorithm 1 (paper Sec. 4.1).

For each turn t and each agent i in turn order, every live environment's observation goes to the
policy sigma(i) in one batched call that returns K candidates per observation. Each candidate is
applied to its own clone of the state and scored there (r = alpha_i * team + local_i, Eq. 4); the
best candidate (ties: lowest index) is chosen and its branch becomes the live state, so the next
agent observes the chosen actions of everyone before it. Advantages are not computed here: the
trainer does it per group (algo/).
"""

from __future__ import annotations

import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Protocol

from mas_lab.algo.credit import OUTCOME, method_of
from mas_lab.algo.groups import Candidate
from mas_lab.config import Sampling, TaskConfig
from mas_lab.envs.base import Env, EnvError, Problem
from mas_lab.modeling import models
from mas_lab.rollout.engine import Generation
from mas_lab.training.metric_names import ROLLOUT_FLOPS


class Generate(Protocol):
    def __call__(
        self, policy: str, prompts: list[list[dict[str, str]]], n: int, sampling: Sampling, seed: int
    ) -> list[list[Generation]]: ...


@dataclass
class AgentTurn:
    """One agent's action at one turn of one episode: the observation, its K candidates, the
    chosen one, and the state after it."""

    turn: int
    role: str
    policy: str
    observation: str
    candidates: list[Candidate]
    chosen: int
    state_after: str
    system: str = ""  # the role's system prompt (the observation is the user message)


@dataclass
class Episode:
    """One problem's trajectory: its live state while it runs, then a plain record. `success`,
    `final_team` and `final_state` are recorded once when the rollout ends (the store writes records, and
    never calls into an environment, e.g. math grading, inside its transaction)."""

    index: int
    problem: Problem
    env: Env
    turns: list[AgentTurn] = field(default_factory=list)
    success: bool = False
    final_state: str = ""
    final_team: float = 0.0  # the team reward of the live state at the end

    def finish(self) -> None:
        self.success = self.env.success
        self.final_team = float(self.env.team_value())
        self.final_state = self.env.render()


@dataclass
class Timing:
    generate_s: float = 0.0
    reward_s: float = 0.0
    generated_tokens: int = 0
    # per policy: the rollout's counted FLOPs (where the engine counts them), its seconds, the peak
    flops: dict[str, float] = field(default_factory=dict)
    policy_s: dict[str, float] = field(default_factory=dict)
    peak_gflops: dict[str, float] = field(default_factory=dict)

    def count(self, policy: str, generations, seconds: float) -> None:
        """Add one call's FLOPs (each candidate carries its share: modeling/flops.py) and seconds."""
        shares = [g.flops for row in generations for g in row if g.flops is not None]
        if not shares:
            return
        self.flops[policy] = self.flops.get(policy, 0.0) + sum(shares)
        self.policy_s[policy] = self.policy_s.get(policy, 0.0) + seconds
        peak = next((g.peak_gflops for row in generations for g in row if g.peak_gflops), None)
        if peak:
            self.peak_gflops[policy] = peak

    def utilisation(self) -> dict[str, float]:
        """Per policy: the rollout's GFLOPs, their rate over its seconds, and that rate against the
        measured matmul peak (where there is one)."""
        gflop, per_s, util = ROLLOUT_FLOPS
        out = {}
        for policy, flops in self.flops.items():
            seconds = self.policy_s[policy]
            rate = flops / seconds / 1e9 if seconds > 0 else 0.0
            out[f"{gflop}/{policy}"] = flops / 1e9
            out[f"{per_s}/{policy}"] = rate
            if policy in self.peak_gflops:
                out[f"{util}/{policy}"] = rate / self.peak_gflops[policy]
        return out


# Scores the K x E candidates of one (turn, agent): each on its own branch (sandbox runs wait on I/O).
_SCORING_POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="score")


def with_system(messages: list[dict[str, str]], system: str | None) -> list[dict[str, str]]:
    """The messages with the role's own system prompt from the task file, when it sets one."""
    if system is None:
        return messages
    rest = messages[1:] if messages and messages[0]["role"] == "system" else messages
    return [{"role": "system", "content": system}, *rest]


def call_seed(seed: int, *parts: object) -> int:
    """A deterministic per-call sampling seed from the step seed and the call's coordinates."""
    return zlib.crc32(repr((seed, parts)).encode()) & 0x7FFFFFFF


def tree_rollout(
    task: TaskConfig,
    episodes: list[Episode],
    generate: Generate,
    k: int,
    seed: int,
    greedy: bool = False,
    timing: Timing | None = None,
    on_turn: Callable[[int, str], None] | None = None,
) -> list[Episode]:
    """Run Algorithm 1's sampling for up to T turns; mutates and returns `episodes`, each
    finished (its success and final state recorded).

    Sequential workflows: each agent observes the live state after the agents before it acted,
    and its chosen branch becomes the live state. Parallel workflows (`Env.parallel`: math, code):
    every agent of a turn observes the state at the start of the turn, and after all of them have
    been sampled and scored, the live state takes over each one's chosen branch in turn order
    (`Env.adopt`: the scored outcome itself, never a second run of the action)."""
    _sample_turns(task, episodes, generate, k, seed, greedy, timing or Timing(), on_turn)
    for episode in episodes:
        episode.finish()
    return episodes


def _sample_turns(task, episodes, generate, k, seed, greedy, timing, on_turn, start=(0, 0)) -> None:
    """The turns from `start` = (turn, agent index) on (a counterfactual continuation starts
    after the agent whose candidates it credits)."""
    parallel = bool(episodes) and episodes[0].env.parallel
    for turn in range(start[0], task.env.max_turns):
        live = [e for e in episodes if not e.env.done]
        if not live:
            return
        chosen: list[list[tuple[str, Env]]] = [[] for _ in live]  # parallel: (role, scored branch)
        for agent_index, role in enumerate(r.name for r in task.roles):
            if turn == start[0] and agent_index < start[1]:
                continue
            if not parallel:
                live = [e for e in live if not e.env.done]
                if not live:
                    return
            if on_turn:
                on_turn(turn, role)
            for position, (episode, branch, _action) in enumerate(
                _sample_agent(task, live, role, turn, agent_index, generate, k, seed, greedy, timing)
            ):
                if parallel:
                    chosen[position].append((role, branch))
                else:
                    episode.env = branch
        if parallel:  # the live state takes over each chosen branch, in turn order; nothing is re-run
            started = time.perf_counter()
            for episode, branches in zip(live, chosen):
                for (role, branch), record in zip(branches, episode.turns[-len(branches) :]):
                    episode.env.adopt(role, branch)
                    episode.env.history.append(branch.history[-1])
                    record.state_after = episode.env.render()
            timing.reward_s += time.perf_counter() - started


def counterfactual_outcomes(task, branches, problems, turn, agent_index, generate, seed, timing) -> list[float]:
    """The team outcome of each scored branch continued to the end of its episode: C3's
    fixed-continuation replay (Chen et al. 2026, arXiv 2603.06859, Sec. 3) on the tree. Every
    branch (a clone: the scored one stays as it is) is played on by the agents after this one,
    then the later turns, each acting greedily (temperature 0, one candidate) from the current
    policy: the same deterministic continuation policy for every sibling, so siblings differ
    only by their own action. Returns each continued branch's final team value
    (`Env.team_value`); a branch already done (or the last agent of the last turn) is its own
    outcome."""
    episodes = [Episode(i, problem, branch.clone()) for i, (problem, branch) in enumerate(zip(problems, branches))]
    start = (turn, agent_index + 1) if agent_index + 1 < len(task.roles) else (turn + 1, 0)
    _sample_turns(
        task, episodes, generate, 1, call_seed(seed, "counterfactual", turn, agent_index), True, timing, None, start
    )
    return [float(e.env.team_value()) for e in episodes]


def _check_context(task, env: Env, role: str, turn: int, generations, max_new_tokens: int) -> None:
    """A prompt and its reply must fit the model's context: past it a model with rotary
    positions still samples, and the run trained on text the model cannot read, without a word.
    Checked on the prompt ids the engine used, before anything is scored, stored or trained."""
    model = task.policies[task.role(role).policy].model
    context = models.context_length(model)
    longest = max((len(g.prompt_ids) for row in generations for g in row), default=0)
    if context is not None and longest + max_new_tokens > context:
        raise EnvError(
            f"env '{type(env).__name__}', role '{role}', turn {turn}: a prompt of {longest} tokens plus "
            f"max_new_tokens {max_new_tokens} is more than the model's context of {context} tokens ({model}); "
            f"shorten the observation or the history, or lower roles.sampling.max_new_tokens"
        )


def _sample_agent(task, live, role, turn, agent_index, generate, k, seed, greedy, timing):
    """One (turn, agent): K candidates per live env in one batched call, each scored on its own
    clone of the state (a role's own K, roles[].k, when the tree samples more than one).
    Records the AgentTurn; yields (episode, chosen branch, chosen action)."""
    spec = task.role(role)
    if spec.k is not None and k > 1:
        k = spec.k
    sampling = spec.sampling.model_copy(update={"temperature": 0.0}) if greedy else spec.sampling
    prompts = [with_system(e.env.messages(role, turn), spec.system_prompt) for e in live]
    started = time.perf_counter()
    generations = generate(spec.policy, prompts, k, sampling, call_seed(seed, turn, agent_index))
    elapsed = time.perf_counter() - started
    timing.generate_s += elapsed
    timing.count(spec.policy, generations, elapsed)
    _check_context(task, live[0].env, role, turn, generations, sampling.max_new_tokens)
    timing.generated_tokens += sum(len(g.response_ids) for row in generations for g in row)

    started = time.perf_counter()
    flat = [g for row in generations for g in row]
    branches = [e.env.clone() for e in live for _ in range(k)]

    def score(branch: Env, generation: Generation):
        return branch.step(role, turn, generation.text)

    results = list(_SCORING_POOL.map(score, branches, flat))
    timing.reward_s += time.perf_counter() - started
    outcomes: list[float] | None = None
    if method_of(task.algorithm.advantage).continuations and not greedy:
        problems = [e.problem for e in live for _ in range(k)]
        outcomes = counterfactual_outcomes(task, branches, problems, turn, agent_index, generate, seed, timing)

    for position, episode in enumerate(live):
        candidates = []
        for c in range(k):
            j = position * k + c
            gen, result = flat[j], results[j]
            components = dict(result.components)
            if outcomes is not None:  # the credit counterfactual advantages read (algo/credit.py)
                own = result.local if task.algorithm.counterfactual_credit == "outcome_and_local" else 0.0
                components[OUTCOME] = spec.alpha * outcomes[j] + own
            candidates.append(
                Candidate(
                    problem_id=episode.problem.id,
                    role=role,
                    turn=turn,
                    index=c,
                    policy=spec.policy,
                    prompt_ids=gen.prompt_ids,
                    response_ids=gen.response_ids,
                    response=gen.text,
                    reward=spec.alpha * result.team + result.local,
                    team=result.team,
                    local=result.local,
                    components=components,
                    info=result.info,
                    state_after=branches[j].render(),
                    logprobs=gen.logprobs,
                    temperature=sampling.temperature,
                    entropy=gen.entropy,
                    truncated=gen.truncated,
                    version=gen.version,
                )
            )
        chosen = max(range(k), key=lambda c: (candidates[c].reward, -c))
        candidates[chosen].chosen = True
        branch = branches[position * k + chosen]
        messages = prompts[position]
        system = messages[0]["content"] if messages[0]["role"] == "system" else ""
        episode.turns.append(
            AgentTurn(turn, role, spec.policy, messages[-1]["content"], candidates, chosen, branch.render(), system)
        )
        yield episode, branch, candidates[chosen].response
