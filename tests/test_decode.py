"""The engine's sampling loop (rollout/decode.py): one prefill per prompt, per-candidate seeds."""

import torch

from mas_lab.config import Sampling
from mas_lab.modeling.models import resolve
from mas_lab.rollout import decode
from mas_lab.rollout.engine import HFEngine

SHORT = [{"role": "user", "content": "write a"}]
LONG = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "a much longer prompt, please answer it"},
]


def engine() -> HFEngine:
    return HFEngine(resolve("tiny-test"), threads=1)


def tokens(rows):
    return [[g.response_ids for g in row] for row in rows]


def test_greedy_equals_transformers_generate():
    eng = engine()
    rows = eng.generate("shared", [SHORT, LONG], 1, Sampling(temperature=0.0, max_new_tokens=12), seed=0)
    for messages, row in zip([SHORT, LONG], rows):
        ids = eng.encode(messages)
        out = eng.model.generate(
            input_ids=torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False,
            max_new_tokens=12,
            eos_token_id=sorted(eng.eos_ids),
            pad_token_id=eng.tokenizer.pad_token_id,
        )[0, len(ids) :].tolist()
        expected = next((out[: i + 1] for i, t in enumerate(out) if t in eng.eos_ids), out)
        assert row[0].response_ids == expected


def test_a_candidate_does_not_depend_on_the_other_prompts_of_the_call():
    eng = engine()
    sampling = Sampling(temperature=1.0, top_p=0.9, max_new_tokens=16)
    both = eng.generate("shared", [SHORT, LONG], 3, sampling, seed=7)
    alone = eng.generate("shared", [SHORT], 3, sampling, seed=7)
    second = eng.generate("shared", [LONG], 3, sampling, seed=7, first_index=1)  # a worker given the slice [1:]
    assert tokens(alone)[0] == tokens(both)[0] and tokens(second)[0] == tokens(both)[1]
    for a, b in zip(second[0], both[1]):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-5
    assert tokens(eng.generate("shared", [SHORT, LONG], 3, sampling, seed=7)) == tokens(both)  # seeded
    assert tokens(eng.generate("shared", [SHORT, LONG], 3, sampling, seed=8)) != tokens(both)
    assert len({tuple(t) for t in tokens(both)[1]}) > 1  # K distinct draws, not K copies


def test_rows_stop_at_a_stop_token_or_at_the_budget():
    eng = engine()
    rows = eng.generate("shared", [SHORT, LONG], 8, Sampling(temperature=1.5, max_new_tokens=6), seed=1)
    for g in (g for row in rows for g in row):
        stops = [i for i, t in enumerate(g.response_ids) if t in eng.eos_ids]
        assert stops in ([], [len(g.response_ids) - 1])  # nothing after the stop token
        assert g.truncated == (not stops) and (stops or len(g.response_ids) == 6)
        assert len(g.logprobs) == len(g.response_ids)


def test_inverse_cdf_sampling_follows_the_distribution():
    probs = torch.tensor([[0.5, 0.0, 0.3, 0.2]] * 20000)
    picked = decode._inverse_cdf(
        probs, torch.rand(20000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    )
    freq = torch.bincount(picked, minlength=4).double() / 20000
    assert freq[1] == 0.0  # probability zero is never drawn
    assert torch.allclose(freq, torch.tensor([0.5, 0.0, 0.3, 0.2], dtype=torch.float64), atol=0.015)
    edge = decode._inverse_cdf(torch.tensor([[0.0, 1.0, 0.0]]), torch.tensor([1.0], dtype=torch.float64))
    assert edge.tolist() == [1]  # u = 1 stays on a token with mass


def test_top_p_keeps_the_smallest_head_reaching_the_mass():
    kept = decode._filter_top_p(torch.tensor([[0.1, 0.5, 0.25, 0.15]]), 0.7)
    assert kept.tolist() == [[0.0, 0.5, 0.25, 0.0]]
    assert decode._filter_top_p(torch.tensor([[0.9, 0.1]]), 0.5)[0, 1] == 0.0  # the first always stays


def test_identical_prompts_are_prefilled_once_and_sample_as_if_apart():
    """Trajectory mode asks for K trajectories of one problem: K identical first prompts, n = 1."""
    eng = engine()
    sampling = Sampling(temperature=1.0, max_new_tokens=10)
    widths = []
    hook = eng.model.register_forward_pre_hook(
        lambda _, args, kwargs: widths.append(kwargs["input_ids"].shape), with_kwargs=True
    )
    try:
        together = eng.generate("shared", [LONG, LONG, SHORT, LONG], 2, sampling, seed=3)
    finally:
        hook.remove()
    assert widths[0][0] == 2  # the prefill: two distinct prompts, not four
    for i, messages in enumerate([LONG, LONG, SHORT, LONG]):
        alone = eng.generate("shared", [messages], 2, sampling, seed=3, first_index=i)
        assert tokens(alone)[0] == tokens(together)[i]
    assert tokens(together)[0] != tokens(together)[1]  # same prompt, its own seeds


def test_the_reserved_cache_holds_what_concatenation_would_and_grows_when_it_must():
    from mas_lab.rollout.kv_cache import ReservedLayer

    layer, keys, values = ReservedLayer(capacity=5), torch.empty(3, 2, 0, 4), torch.empty(3, 2, 0, 4)
    for width in (3, 1, 1, 4, 1):  # 3 + 1 + 1 fill the room, then it doubles and more
        k, v = torch.randn(3, 2, width, 4), torch.randn(3, 2, width, 4)
        got_k, got_v = layer.update(k, v)
        keys, values = torch.cat([keys, k], dim=-2), torch.cat([values, v], dim=-2)
        assert torch.equal(got_k, keys) and torch.equal(got_v, values) and layer.get_seq_length() == keys.shape[-2]
    assert layer._keys.shape[-2] >= 10
    index = torch.tensor([2, 0])
    layer.batch_select_indices(index)
    assert torch.equal(layer.keys, keys[index]) and torch.equal(layer.values, values[index])
    k = torch.randn(2, 2, 1, 4)
    assert torch.equal(layer.update(k, k)[0], torch.cat([keys[index], k], dim=-2))


def test_sampling_with_the_reserved_cache_equals_sampling_with_concatenation(monkeypatch):
    """Same tokens, log-probs within float32 rounding, rows leaving the batch at their stop token."""
    from mas_lab.rollout import decode

    eng = HFEngine(resolve("tiny-test"), threads=1)
    prompts = [eng.encode([{"role": "user", "content": text}]) for text in ("write a", "say b please", "c")]
    args = dict(
        temperature=1.0,
        top_p=1.0,
        max_new_tokens=24,
        stop_ids=eng.eos_ids | {eng.tokenizer.convert_tokens_to_ids("a")},
        pad_id=eng.tokenizer.pad_token_id,
        seed=7,
    )
    reserved = decode.sample(eng.model, prompts, 4, **args)
    monkeypatch.setattr(decode, "RESERVED_CACHE", False)
    concatenated = decode.sample(eng.model, prompts, 4, **args)
    lengths = {len(d.tokens) for row in reserved for d in row}
    assert len(lengths) > 1  # some rows stopped early: the cache lost rows on the way
    for row, other in zip(reserved, concatenated):
        for a, b in zip(row, other):
            assert a.tokens == b.tokens and a.truncated == b.truncated
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-5
