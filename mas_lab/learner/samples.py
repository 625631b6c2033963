"""What the trainer sends a learner: one candidate as a training sample."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sample:
    """One candidate's tokens and its group-relative advantage (paper Eq. 3), routed to the
    learner of its role's policy. The loss covers the response tokens only. `temperature` is the
    one it was sampled at: the learner's log-probs are of softmax(logits / temperature), the
    distribution that was sampled; `sampler_logprobs` (one per response token, when the engine
    reported them) measure how far the learner's log-probs are from the sampler's."""

    prompt_ids: list[int]
    response_ids: list[int]
    advantage: float
    temperature: float = 1.0
    sampler_logprobs: tuple[float, ...] = ()
    demonstration: bool = False  # a format warm-up reply (train.warmup_steps), not sampled from the policy
    role: str = ""  # the agent that produced it (per-role diagnostics)
