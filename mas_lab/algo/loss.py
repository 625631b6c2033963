"""The clipped policy-gradient objective at token level (paper Eq. 5, PPO/GRPO surrogate).

ratio = exp(logp - logp_old); per token: -min(ratio * A, clip(ratio, 1-eps_low, 1+eps_high) * A),
with optional dual clip (Ye et al. 2020): for A < 0 the loss is capped at -c * A. The sample's
advantage is broadcast to every response token; prompt and padding tokens have mask 0.
Aggregation: token-mean over the whole batch, or seq-mean-token-mean.

Truncated importance sampling (Yao et al. 2025, "Your efficient RL framework secretly brings you
off-policy RL training"): the rollout engine samples from pi_sampler, whose numerics differ from
the learner's pi_old; each token's loss is weighted by w = min(pi_old / pi_sampler, C), detached.
"""

from __future__ import annotations

import torch


def clipped_policy_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float | None = None,
    agg: str = "token_mean",
    normalizer: float | None = None,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Loss of a (micro-)batch. logp, logp_old, mask: [B, L]; advantages: [B].

    `normalizer` is the token count (token_mean) or sequence count (seq_mean_token_mean) of the
    whole batch, or a fixed token budget (constant: Dr. GRPO, Liu et al. 2025), so micro-batches accumulate to exactly the full-batch loss. `is_weights` ([B, L],
    no gradient): per-token importance weights (truncated IS), 1 where omitted.
    """
    mask = mask.to(logp.dtype)
    adv = advantages.to(logp.dtype).unsqueeze(1)
    ratio = torch.exp(logp - logp_old)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    if dual_clip is not None:
        per_token = torch.where(adv < 0, torch.minimum(per_token, -dual_clip * adv), per_token)
    if is_weights is not None:
        per_token = per_token * is_weights.detach().to(per_token.dtype)
    if agg in ("token_mean", "constant"):  # constant: the normalizer is a fixed token budget (Dr. GRPO)
        if agg == "constant" and normalizer is None:
            raise ValueError("loss aggregation 'constant' needs its fixed token budget as the normalizer")
        denominator = normalizer if normalizer is not None else mask.sum().clamp(min=1.0)
        loss = (per_token * mask).sum() / denominator
    elif agg == "seq_mean_token_mean":
        per_seq = (per_token * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        denominator = normalizer if normalizer is not None else float(per_token.shape[0])
        loss = per_seq.sum() / denominator
    else:
        raise ValueError(f"unknown loss aggregation '{agg}'")
    with torch.no_grad():
        was_clipped = ((ratio < 1.0 - eps_low) | (ratio > 1.0 + eps_high)).to(logp.dtype) * mask
        stats = {
            "clipped_tokens": float(was_clipped.sum()),
            "tokens": float(mask.sum()),
            "ratio_sum": float((ratio * mask).sum()),
        }
        if mask.any():
            picked = ratio[mask.bool()]
            stats["ratio_min"], stats["ratio_max"] = float(picked.min()), float(picked.max())
    return loss, stats


def kl_penalty(
    logp: torch.Tensor, logp_ref: torch.Tensor, mask: torch.Tensor, normalizer: float
) -> tuple[torch.Tensor, float]:
    """The KL penalty to a reference policy (GRPO, Shao et al. 2024, Eq. 4), per token with the k3
    estimator (Schulman 2020): exp(ref - logp) - (ref - logp) - 1, >= 0, unbiased for
    KL(current || reference) under the current policy's samples; summed over the response tokens and
    divided by `normalizer` (the loss's token count). Its gradient in logp is 1 - exp(ref - logp).
    Returns the penalty (with gradient) and the sum of the per-token values (for the metric)."""
    delta = (logp_ref.detach() - logp) * mask.to(logp.dtype)
    per_token = (torch.exp(delta) - delta - 1.0) * mask.to(logp.dtype)
    return per_token.sum() / normalizer, float(per_token.detach().sum())
