"""The sampling loop of the transformers engine: K candidates per prompt from one shared prefill.

AT-GRPO samples K candidates from one observation at every (turn, agent) (paper Sec. 4.1), and
the observations are long while the answers are short. `generate(num_return_sequences=K)` copies
each prompt K times before the prefill; here each distinct prompt of a call is prefilled once (the
K trajectories of one problem share their first observation) and its KV cache is repeated for its
candidates, finished rows leave the batch (their cache is dropped, so later steps attend over
fewer rows), the output layer runs for the last position only, and new keys and values are
written into a cache reserved for the whole call (rollout/kv_cache.py) instead of being
concatenated onto it at every token. The tokens every distinct
prompt of a call starts with (one role's system prompt and task preamble: 106-128 of 230-296
tokens on Plan-Path and Sokoban) are prefilled once for the whole call, and each prompt's own
remainder runs on top of them (`shared_prefix`); the learner does the same.

Every candidate draws its tokens from its own torch.Generator seeded by (call seed, prompt index,
candidate index): what one candidate samples does not depend on which other prompts share the
batch, so prompts split over several rollout workers give the same candidates as one worker.

Per token it records the log-probability under softmax(logits / temperature) (the distribution
the learner differentiates; top-p truncation is applied to sampling but not renormalised into the
log-prob, as in TRL and verl) and that distribution's entropy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mas_lab.modeling.prefill import after_prefix, cache_keyword, prefill_prefix, shared_prefix

SEED_STRIDE = 1_000_003  # seeds of different calls do not collide for up to a million candidates
RESERVED_CACHE = True  # False: transformers' DynamicCache (benchmarks/sampling_loop.py compares them)


@dataclass
class Decoded:
    tokens: list[int]
    logprobs: list[float]  # empty when greedy
    entropy: list[float]  # empty when greedy
    truncated: bool  # cut at max_new_tokens before any stop token (the engine's Generation says the same)


def row_seed(seed: int, prompt_index: int, candidate: int, n: int) -> int:
    return (seed * SEED_STRIDE + prompt_index * n + candidate) % (2**63 - 1)


def _inverse_cdf(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """One token per row: the first whose cumulative probability exceeds u * total (a token of
    probability zero is never picked). One uniform number per row and one cumsum over the batch:
    torch.multinomial costs about a millisecond per row over a 49k vocabulary."""
    cdf = probs.double().cumsum(-1)
    total = cdf[:, -1:].contiguous()
    picked = torch.searchsorted(cdf, uniform.unsqueeze(-1) * total, right=True)
    last_with_mass = torch.searchsorted(cdf, total, right=False)  # where u * total rounds up to the total
    return torch.minimum(picked, last_with_mass).squeeze(-1)


def _filter_top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the most likely tokens up to cumulative mass top_p (the first always), Holtzman et al."""
    ordered, index = probs.sort(dim=-1, descending=True)
    mass_before = ordered.cumsum(-1) - ordered
    ordered = ordered.masked_fill(mass_before > top_p, 0.0)
    return torch.zeros_like(probs).scatter_(-1, index, ordered)


@torch.no_grad()
def sample(
    model,
    prompts: list[list[int]],
    n: int,
    *,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    stop_ids: set[int],
    pad_id: int,
    seed: int,
    first_index: int = 0,
) -> list[list[Decoded]]:
    """n candidates for each prompt (token ids). `first_index` is the index of prompts[0] in the
    caller's whole list (rollout workers that got a slice seed as if they had all prompts)."""
    # lazy: transformers (and torch), only when a model or tokenizer is built
    from transformers import DynamicCache

    # lazy: transformers' cache classes, only when a model decodes
    from mas_lab.rollout.kv_cache import ReservedCache

    greedy = temperature == 0.0
    device = next(model.parameters()).device  # the model's; sampling itself runs on the CPU
    # Identical prompts (the K trajectories of one problem at turn 0 in trajectory mode) are
    # prefilled once; every candidate row then starts from its prompt's cache row.
    distinct: dict[tuple[int, ...], int] = {}
    source = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
    shared = shared_prefix(list(distinct))
    ids, attention, positions = (t.to(device) for t in after_prefix(list(distinct), pad_id, shared))
    # updated in place by every forward, with room for the whole call (no copy of it per token)
    cache = ReservedCache(shared + ids.shape[1] + max_new_tokens) if RESERVED_CACHE else DynamicCache()
    cache_arg = {cache_keyword(model): cache}
    if shared:
        prefill_prefix(
            model,
            torch.tensor(next(iter(distinct))[:shared], device=device),
            len(distinct),
            cache,
            cache_arg,
            logits_to_keep=1,
        )
    out = model(
        input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=True, logits_to_keep=1, **cache_arg
    )
    rows = len(prompts) * n
    row_prompt = torch.tensor([source[r // n] for r in range(rows)])
    logits = out.logits[:, -1].float().cpu()[row_prompt]
    row_prompt = row_prompt.to(device)
    cache.batch_select_indices(row_prompt)
    attention = attention[row_prompt]
    next_position = positions[:, -1][row_prompt] + 1

    generators = [torch.Generator().manual_seed(row_seed(seed, first_index + r // n, r % n, n)) for r in range(rows)]
    results = [Decoded([], [], [], True) for _ in range(rows)]
    live = list(range(rows))  # the candidate of each batch row
    stops = torch.tensor(sorted(stop_ids))
    for step in range(max_new_tokens):
        if greedy:
            tokens = logits.argmax(-1)
        else:
            log_p = torch.log_softmax(logits / temperature, dim=-1)
            probs = log_p.exp()
            entropy = -(probs * log_p).sum(-1)
            if top_p < 1.0:
                probs = _filter_top_p(probs, top_p)
            tokens = _inverse_cdf(
                probs, torch.cat([torch.rand(1, generator=generators[r], dtype=torch.float64) for r in live])
            )
            picked = log_p.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        finished = torch.isin(tokens, stops)
        token_list, done = tokens.tolist(), finished.tolist()
        for b, r in enumerate(live):
            result = results[r]
            result.tokens.append(token_list[b])
            if not greedy:
                result.logprobs.append(float(picked[b]))
                result.entropy.append(float(entropy[b]))
            result.truncated = not done[b]
        if step == max_new_tokens - 1:
            break
        keep = [b for b in range(len(live)) if not done[b]]
        if not keep:
            break
        if len(keep) < len(live):  # finished rows leave the batch and take their cache with them
            index = torch.tensor(keep, device=device)
            cache.batch_select_indices(index)
            attention, next_position, tokens = attention[index], next_position[index], tokens[index.cpu()]
            live = [live[b] for b in keep]
        attention = torch.cat([attention, torch.ones(len(live), 1, dtype=attention.dtype, device=device)], dim=1)
        out = model(
            input_ids=tokens.unsqueeze(-1).to(device),
            attention_mask=attention,
            position_ids=next_position.unsqueeze(-1),
            use_cache=True,
            logits_to_keep=1,
            **cache_arg,
        )
        logits = out.logits[:, -1].float().cpu()
        next_position = next_position + 1
    return [results[p * n : (p + 1) * n] for p in range(len(prompts))]
