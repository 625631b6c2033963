"""Groups keyed (problem, agent, turn): the agent- and turn-wise grouping of AT-GRPO (Sec. 4.1).

Under tree sampling all K candidates of a group come from one observation, so a group is only
valid if it has exactly K members with one prompt (checked by hash), one problem, one agent and
one turn (AT_GRPO.md invariants 1 and 4).
"""
from __future__ import annotations

import hashlib
import statistics
from dataclasses import dataclass, field


class GroupError(ValueError):
    """A group that breaks the AT-GRPO grouping invariants."""


def prompt_hash(prompt_ids: list[int]) -> str:
    return hashlib.sha1(",".join(map(str, prompt_ids)).encode()).hexdigest()[:16]


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

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.problem_id, self.role, self.turn)

    @property
    def prompt_hash(self) -> str:
        return prompt_hash(self.prompt_ids)


@dataclass
class Group:
    key: tuple[str, str, int]
    members: list[Candidate]

    @property
    def rewards(self) -> list[float]:
        return [c.reward for c in self.members]


def build_groups(candidates: list[Candidate], k: int) -> list[Group]:
    """Group candidates by (problem, agent, turn) and check every invariant of a group."""
    by_key: dict[tuple[str, str, int], list[Candidate]] = {}
    for candidate in candidates:
        by_key.setdefault(candidate.key, []).append(candidate)
    groups = []
    for key, members in by_key.items():
        if len(members) != k:
            raise GroupError(f"group {key} has {len(members)} members, expected exactly K={k}")
        if len({m.prompt_hash for m in members}) != 1:
            raise GroupError(f"group {key} mixes prompts: its candidates did not share one observation")
        if sorted(m.index for m in members) != list(range(k)):
            raise GroupError(f"group {key} has duplicated or missing candidate indices")
        groups.append(Group(key, sorted(members, key=lambda m: m.index)))
    return groups


def group_stats(group: Group) -> dict[str, float]:
    rewards = group.rewards
    advantages = [m.advantage for m in group.members]
    return {
        "n": len(rewards),
        "reward_mean": statistics.fmean(rewards),
        "reward_std": statistics.stdev(rewards) if len(rewards) > 1 else 0.0,
        "reward_min": min(rewards),
        "reward_max": max(rewards),
        "adv_min": min(advantages),
        "adv_max": max(advantages),
        "zero_std": float(max(rewards) - min(rewards) == 0.0),
    }
