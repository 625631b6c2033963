"""Groups keyed (problem, agent, turn): the agent- and turn-wise grouping of AT-GRPO (Sec. 4.1).

Under tree sampling all K candidates of a group come from one observation, so a group is only
valid if it has exactly K members with one prompt (checked by hash), one problem, one agent and
one turn (docs/algorithm.md, invariants 1 and 4).
"""

from __future__ import annotations

import hashlib
import statistics
from dataclasses import dataclass, field
from typing import NamedTuple

from mas_lab.algo.advantage import is_zero_std


class GroupError(ValueError):
    """A group that breaks the AT-GRPO grouping invariants."""


def prompt_hash(prompt_ids: list[int]) -> str:
    return hashlib.sha1(",".join(map(str, prompt_ids)).encode()).hexdigest()[:16]


# The (agent, turn) of a trajectory-level group: every agent, every turn of the trajectory.
ALL_AGENTS, ALL_TURNS = "*", -1


class GroupKey(NamedTuple):
    """(problem, agent, turn): the key of an AT-GRPO group. A trajectory-level group (modes trajectories,
    single_agent) has agent ALL_AGENTS and turn ALL_TURNS: it spans the whole trajectory."""

    problem_id: str
    role: str
    turn: int

    @classmethod
    def trajectory(cls, problem_id: str) -> "GroupKey":
        return cls(problem_id, ALL_AGENTS, ALL_TURNS)

    @property
    def is_trajectory(self) -> bool:
        return self.role == ALL_AGENTS


@dataclass
class Candidate:
    """One sampled action and what it earned. `reward = alpha * team + local` (paper Eq. 4)."""

    problem_id: str
    role: str
    turn: int
    index: int
    policy: str
    prompt_ids: list[int]
    response_ids: list[int]
    response: str
    reward: float
    team: float
    local: float
    components: dict[str, float] = field(default_factory=dict)
    advantage: float = 0.0
    chosen: bool = False
    info: str = ""
    state_after: str = ""
    logprobs: list[float] = field(default_factory=list)  # the sampler's, per response token
    temperature: float = 1.0  # the distribution it was sampled from
    entropy: float | None = None  # mean entropy of that distribution over the response
    truncated: bool = False  # cut at max_new_tokens
    version: int | None = None  # the weight version of the policy that generated it

    @property
    def key(self) -> GroupKey:
        return GroupKey(self.problem_id, self.role, self.turn)

    @property
    def prompt_hash(self) -> str:
        return prompt_hash(self.prompt_ids)


@dataclass
class Group:
    """K units that share one baseline. Under AT-GRPO a unit is one candidate and the key is
    (problem, agent, turn); under trajectory-level GRPO (modes trajectories, single_agent) a unit is one
    whole trajectory, its reward the mean of its actions' rewards, and the key GroupKey.trajectory."""

    key: GroupKey
    units: list[list[Candidate]]
    rewards: list[float]

    @property
    def members(self) -> list[Candidate]:
        return [c for unit in self.units for c in unit]

    def set_advantages(self, advantages: list[float]) -> None:
        for unit, advantage in zip(self.units, advantages):
            for candidate in unit:
                candidate.advantage = advantage


def build_groups(candidates: list[Candidate], k: int, role_k: dict[str, int] | None = None) -> list[Group]:
    """Group candidates by (problem, agent, turn) and check every invariant of a group: exactly K
    members (`role_k`: a role's own K, roles[].k), one observation, indices 0..K-1."""
    by_key: dict[GroupKey, list[Candidate]] = {}
    for candidate in candidates:
        by_key.setdefault(candidate.key, []).append(candidate)
    groups = []
    for key, members in by_key.items():
        size = (role_k or {}).get(key.role, k)
        if len(members) != size:
            raise GroupError(f"group {key} has {len(members)} members, expected exactly K={size}")
        if len({m.prompt_hash for m in members}) != 1:
            raise GroupError(f"group {key} mixes prompts: its candidates did not share one observation")
        if sorted(m.index for m in members) != list(range(size)):
            raise GroupError(f"group {key} has duplicated or missing candidate indices")
        members = sorted(members, key=lambda m: m.index)
        groups.append(Group(key, [[m] for m in members], [m.reward for m in members]))
    return groups


def build_trajectory_groups(
    trajectories: list[tuple[str, list[Candidate]]], k: int, outcomes: list[float] | None = None
) -> list[Group]:
    """Trajectory-level groups (plain GRPO applied to a MAS, docs/algorithm.md "Baselines"): the K
    independent trajectories of one problem form its group; R = mean reward of a trajectory, or,
    with `outcomes` (one per trajectory, in order), the episode's outcome."""
    if outcomes is not None and len(outcomes) != len(trajectories):
        raise ValueError(f"{len(outcomes)} outcomes for {len(trajectories)} trajectories")
    by_problem: dict[str, list[tuple[list[Candidate], float]]] = {}
    for position, (problem_id, candidates) in enumerate(trajectories):
        if not candidates:
            raise GroupError(f"a trajectory of problem {problem_id} has no actions")
        value = statistics.fmean(c.reward for c in candidates) if outcomes is None else outcomes[position]
        by_problem.setdefault(problem_id, []).append((candidates, value))
    groups = []
    for problem_id, units in by_problem.items():
        if len(units) != k:
            raise GroupError(f"problem {problem_id} has {len(units)} trajectories, expected exactly K={k}")
        groups.append(Group(GroupKey.trajectory(problem_id), [u for u, _ in units], [r for _, r in units]))
    return groups


@dataclass(frozen=True)
class GroupStats:
    """One group's statistics: computed here, kept by the run store, shown by the dashboard."""

    problem_id: str
    role: str
    turn: int
    n: int
    reward_mean: float
    reward_std: float
    reward_min: float
    reward_max: float
    adv_min: float
    adv_max: float
    zero_std: bool
    kept: bool


def group_stats(group: Group, kept: bool, tol: float = 0.0) -> GroupStats:
    """Reward and advantage statistics of a group; `kept`: whether the filter let it through."""
    rewards = group.rewards
    advantages = [unit[0].advantage for unit in group.units]
    return GroupStats(
        *group.key,
        n=len(rewards),
        reward_mean=statistics.fmean(rewards),
        reward_std=statistics.stdev(rewards) if len(rewards) > 1 else 0.0,
        reward_min=min(rewards),
        reward_max=max(rewards),
        adv_min=min(advantages),
        adv_max=max(advantages),
        zero_std=is_zero_std(rewards, tol),
        kept=kept,
    )
