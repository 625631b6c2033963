"""Prompts computed once: the pieces of a forward pass that the sampling loop (rollout/decode.py)
and the learner share. AT-GRPO's K candidates of a (turn, agent) come from one observation (paper
Sec. 4.1), and the observations of one role start with the same system prompt and task preamble,
so both sides run the common prefix of a batch once, then each distinct prompt's remainder once,
and repeat the keys and values for the rows that continue them.
"""

from __future__ import annotations

import inspect
import os
from typing import Any, Sequence

import torch

MIN_SHARED_PREFIX = 16  # shorter common prefixes are not worth a forward call of their own


def cache_keyword(model) -> str:
    """`cache` in recent transformers, `past_key_values` before (and still accepted, deprecated)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    cls = type(base)
    if cls not in _CACHE_KEYWORDS:
        _CACHE_KEYWORDS[cls] = "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"
    return _CACHE_KEYWORDS[cls]


_CACHE_KEYWORDS: dict[Any, str] = {}  # model class -> its forward's cache keyword


def left_pad(sequences: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token ids left-padded to one width, their attention mask, and position ids that start at 0
    on each sequence's first real token (the prompt side of the sampling loop and of the learner)."""
    width = max(len(s) for s in sequences)
    ids = torch.tensor([[pad_id] * (width - len(s)) + list(s) for s in sequences])
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in sequences])
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def shared_prefix(prompts: list[tuple[int, ...]]) -> int:
    """How many leading tokens every prompt has in common, leaving each at least one token of its
    own (its last position gives the next-token logits); 0 for fewer than two prompts or a common
    part under MIN_SHARED_PREFIX tokens."""
    if len(prompts) < 2:
        return 0
    common = min(len(os.path.commonprefix(list(prompts))), min(len(p) for p in prompts) - 1)
    return common if common >= MIN_SHARED_PREFIX else 0


def after_prefix(
    prompts: list[tuple[int, ...]], pad_id: int, shared: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The prompts without their first `shared` tokens, left-padded ([P, w]); the attention mask
    over the prefix and them ([P, shared + w]: ones for the prefix, then the padding mask), and
    their position ids, which continue the prefix's. The padding sits between the prefix and each
    remainder, where the mask hides it; with shared = 0 this is `left_pad`."""
    ids, mask, positions = left_pad([p[shared:] for p in prompts], pad_id)
    if not shared:
        return ids, mask, positions
    return ids, torch.cat([torch.ones(len(prompts), shared, dtype=mask.dtype), mask], dim=1), positions + shared


def prefill_prefix(model, prefix: torch.Tensor, rows: int, cache, cache_arg: dict, **kwargs) -> None:
    """Run the shared prefix ([shared] token ids) once into `cache`, then repeat it for `rows` rows
    (`kwargs` go to the forward call, e.g. logits_to_keep=1 for a causal LM)."""
    positions = torch.arange(len(prefix), device=prefix.device).unsqueeze(0)
    model(input_ids=prefix.unsqueeze(0), position_ids=positions, use_cache=True, **cache_arg, **kwargs)
    cache.batch_select_indices(torch.zeros(rows, dtype=torch.long, device=prefix.device))
