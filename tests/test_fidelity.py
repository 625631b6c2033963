"""What the learner optimises is what the sampler sampled (learning issue, section 1)."""

import torch

from mas_lab.config import Algorithm, Sampling
from mas_lab.envs.games import extract_code
from mas_lab.learner.learner import Learner
from mas_lab.learner.samples import Sample
from mas_lab.modeling.models import resolve
from mas_lab.rollout.engine import HFEngine, stop_ids

PROMPTS = [
    [{"role": "user", "content": "write a"}],
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "a longer prompt, please answer"}],
]


def sampled(temperature: float, top_p: float):
    folder = resolve("tiny-test")
    engine = HFEngine(folder, threads=1)
    rows = engine.generate(
        "shared", PROMPTS, 3, Sampling(temperature=temperature, top_p=top_p, max_new_tokens=16), seed=3
    )
    learner = Learner(folder, Algorithm(), threads=1)
    return [g for row in rows for g in row], learner


def test_the_learners_logprobs_equal_the_samplers_at_temperature_and_top_p():
    generations, learner = sampled(0.7, 0.9)
    assert all(len(g.logprobs) == len(g.response_ids) > 0 for g in generations)
    samples = [Sample(g.prompt_ids, g.response_ids, 0.0, 0.7, tuple(g.logprobs)) for g in generations]
    batch = learner._batch(samples)
    with torch.no_grad():
        logp = learner._logp(batch)
    known = batch.mask.bool()
    assert (logp[known] - batch.sampler[known]).abs().max() < 1e-4
    at_one = learner._batch([Sample(s.prompt_ids, s.response_ids, 0.0, 1.0, s.sampler_logprobs) for s in samples])
    with torch.no_grad():
        wrong = learner._logp(at_one)
    assert (wrong[known] - batch.sampler[known]).abs().max() > 1e-2  # temperature 1 was the old mistake


def full_sequence_logp(learner, samples):
    """The plain way: each sample's prompt + response through the model on its own."""
    out = []
    for s in samples:
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        logits = learner.model(input_ids=ids).logits[0, len(s.prompt_ids) - 1 : -1].float() / s.temperature
        out.append(torch.log_softmax(logits, -1).gather(-1, torch.tensor(s.response_ids).unsqueeze(-1)).squeeze(-1))
    return out


def test_shared_prompt_forward_equals_the_full_sequence_forward_values_and_gradients():
    generations, learner = sampled(0.7, 1.0)
    samples = [Sample(g.prompt_ids, g.response_ids, 1.0 if i % 3 else -1.0, 0.7) for i, g in enumerate(generations)]
    learner.algo = Algorithm(micro_batch=4)  # 2 prompts x 3 candidates: a group is not split to fill a batch
    assert [b.prompt_ids.shape[0] for b in learner._micro_batches(samples)] == [1, 1]
    learner.algo = Algorithm(micro_batch=6)
    batches = learner._micro_batches(samples)
    assert [b.prompt_ids.shape[0] for b in batches] == [2] and batches[0].which.tolist() == [0, 0, 0, 1, 1, 1]
    params = [p for p in learner.model.parameters() if p.requires_grad]
    logp = learner._logp(batches[0])
    rows = [row[batches[0].mask[i].bool()] for i, row in enumerate(logp)]
    order = sorted(samples, key=lambda s: tuple(s.prompt_ids))  # micro-batches take prompts in token order
    reference = full_sequence_logp(learner, order)
    for got, want in zip(rows, reference):
        assert (got - want).abs().max() < 1e-5
    grad_shared = torch.autograd.grad(sum(r.sum() for r in rows), params)
    grad_full = torch.autograd.grad(sum(r.sum() for r in full_sequence_logp(learner, order)), params)
    assert max(float((a - b).abs().max()) for a, b in zip(grad_shared, grad_full)) < 1e-4


def test_the_update_reports_the_rollout_training_mismatch():
    generations, learner = sampled(0.7, 0.9)
    samples = [
        Sample(g.prompt_ids, g.response_ids, 1.0 if i % 2 else -1.0, 0.7, tuple(g.logprobs))
        for i, g in enumerate(generations)
    ]
    result = learner.update({"shared": samples})["shared"]
    assert 0.0 <= result["mismatch_abs"] < 1e-4 and 0.0 <= result["mismatch_kl"] < 1e-6
    without = learner.update({"shared": [Sample(s.prompt_ids, s.response_ids, s.advantage) for s in samples]})["shared"]
    assert "mismatch_abs" not in without  # nothing to compare with


def test_greedy_candidates_carry_no_logprobs():
    folder = resolve("tiny-test")
    rows = HFEngine(folder, threads=1).generate(
        "shared", PROMPTS, 1, Sampling(temperature=0.0, max_new_tokens=8), seed=0
    )
    assert all(g.logprobs == [] for row in rows for g in row)


def test_an_unclosed_code_block_runs_without_the_prose_before_it():
    assert extract_code("Here is the code:\n```python\nprint(['R', 'D'])\nprint(") == "print(['R', 'D'])\nprint("
    assert extract_code("```python\na = 1\n```\nthen\n```python\nb = 2\n```") == "b = 2\n"
    assert extract_code("print(1)") == "print(1)"


def test_every_end_of_turn_token_stops_generation():
    class Tokenizer:
        eos_token_id = 2

        def get_vocab(self):
            return {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2, "a": 3}

    class Model:
        class generation_config:
            eos_token_id = [2, 7]

    assert stop_ids(Tokenizer(), Model()) == {0, 2, 7}


def test_kl_to_the_initial_policy_starts_at_zero_grows_and_survives_a_checkpoint(tmp_path):
    generations, learner = sampled(0.7, 0.9)
    learner.algo = Algorithm(lr=1e-2, kl_probe=4)
    learner.optimizers["shared"].param_groups[0]["lr"] = 1e-2
    samples = [
        Sample(g.prompt_ids, g.response_ids, 1.0 if i % 2 else -1.0, 0.7, tuple(g.logprobs))
        for i, g in enumerate(generations)
    ]
    first = learner.update({"shared": samples})["shared"]
    assert first["kl_initial"] == 0.0  # the probe is taken before the first update
    assert first["ratio_mean"] == 1.0 and first["ratio_min"] == first["ratio_max"] == 1.0  # one epoch: on-policy
    second = learner.update({"shared": samples})["shared"]
    assert second["kl_initial"] > 1e-4
    learner.save("shared", str(tmp_path / "ckpt"))
    again = Learner(resolve("tiny-test"), Algorithm(lr=1e-2, kl_probe=4), threads=1)
    again.load("shared", str(tmp_path / "ckpt"))
    assert again._kl_to_initial("shared", samples) == learner._kl_to_initial("shared", samples)
    assert again._kl_to_initial("shared", samples) > 1e-4  # measured against the restored initial policy
    off = Learner(resolve("tiny-test"), Algorithm(kl_probe=0), threads=1)
    assert "kl_initial" not in off.update({"shared": samples})["shared"]


def test_ratio_statistics_with_several_epochs():
    generations, learner = sampled(0.7, 0.9)
    learner.algo = Algorithm(lr=1e-2, epochs=2)
    learner.optimizers["shared"].param_groups[0]["lr"] = 1e-2
    samples = [Sample(g.prompt_ids, g.response_ids, 1.0 if i % 2 else -1.0, 0.7) for i, g in enumerate(generations)]
    out = learner.update({"shared": samples})["shared"]
    assert out["ratio_min"] < 1.0 < out["ratio_max"]  # the second epoch sees the moved policy


def test_truncated_importance_sampling_weights_each_token_by_the_capped_ratio():
    from mas_lab.algo.loss import clipped_policy_loss
    from mas_lab.learner.learner import truncated_is_weights

    logp_old = torch.log(torch.tensor([[0.5, 0.2, 0.9]]))
    sampler = torch.log(torch.tensor([[0.25, 0.4, float("nan")]]))  # ratio 2, 0.5, unknown
    weights = truncated_is_weights(logp_old, sampler, cap=1.5)
    assert torch.allclose(weights, torch.tensor([[1.5, 0.5, 1.0]]))  # capped, kept, 1 where unknown
    logp = logp_old.clone().requires_grad_(True)
    mask, adv = torch.ones(1, 3), torch.tensor([1.0])
    plain, _ = clipped_policy_loss(logp, logp_old, adv, mask)
    weighted, _ = clipped_policy_loss(logp, logp_old, adv, mask, is_weights=weights)
    assert torch.allclose(weighted, plain * weights.mean())  # ratio 1 at logp_old: per-token loss -A, then weighted
    (grad,) = torch.autograd.grad(weighted, logp)
    assert torch.allclose(grad, -weights / 3)


def test_the_learner_applies_and_reports_truncated_importance_sampling():
    generations, learner = sampled(1.0, 1.0)
    shifted = [
        Sample(g.prompt_ids, g.response_ids, 1.0 if i % 2 else -1.0, 1.0, tuple(lp - 0.5 for lp in g.logprobs))
        for i, g in enumerate(generations)
    ]  # a sampler that put less mass on its tokens: ratio e^0.5 > cap
    learner.algo = Algorithm(tis_cap=1.2, lr=1e-9)
    result = learner.update({"shared": shifted})["shared"]
    assert abs(result["tis_weight_mean"] - 1.2) < 1e-4 and result["tis_capped_frac"] == 1.0
    learner.algo = Algorithm(lr=1e-9)
    assert "tis_weight_mean" not in learner.update({"shared": shifted})["shared"]


SYSTEM = (
    "You are the planner. Solve the task. End with one line 'Moves:' followed by your moves, one letter "
    "each (U, D, L or R)."
)
ROLE_PROMPTS = [
    [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
    for text in ("Grid: .G. / ..S", "Grid: S.. / ... / ..G, G is 2 rows down", "Grid: G S")
]


def _prefilled_tokens(model) -> list[int]:
    """Token counts of each forward call of `model` (a hook), to see what was prefilled."""
    counts: list[int] = []
    model.register_forward_pre_hook(
        lambda module, args, kwargs: counts.append(kwargs["input_ids"].numel()), with_kwargs=True
    )
    return counts


def test_a_shared_prefix_is_prefilled_once_and_samples_the_same_tokens(monkeypatch):
    from mas_lab.modeling import prefill

    folder = resolve("tiny-test")
    engine = HFEngine(folder, threads=1)
    encoded = [tuple(engine.encode(p)) for p in ROLE_PROMPTS]
    shared = prefill.shared_prefix(encoded)
    assert shared >= prefill.MIN_SHARED_PREFIX and all(p[:shared] == encoded[0][:shared] for p in encoded)
    counts = _prefilled_tokens(engine.model)
    sampling = Sampling(temperature=0.7, top_p=0.9, max_new_tokens=12)
    rows = engine.generate("shared", ROLE_PROMPTS, 3, sampling, seed=5)
    assert counts[0] == shared and counts[1] == 3 * max(len(p) - shared for p in encoded)  # prefix once, then the rest
    monkeypatch.setattr(prefill, "MIN_SHARED_PREFIX", 10**6)  # every prompt whole, as before
    counts.clear()
    plain = engine.generate("shared", ROLE_PROMPTS, 3, sampling, seed=5)
    assert counts[0] == 3 * max(map(len, encoded))
    for row, plain_row in zip(rows, plain):
        for g, p in zip(row, plain_row):
            assert g.response_ids == p.response_ids
            assert max(abs(a - b) for a, b in zip(g.logprobs, p.logprobs)) < 1e-4


def test_the_learner_computes_a_shared_prefix_once_with_the_same_logprobs_and_gradients():
    folder = resolve("tiny-test")
    engine = HFEngine(folder, threads=1)
    rows = engine.generate("shared", ROLE_PROMPTS, 2, Sampling(temperature=0.7, max_new_tokens=10), seed=2)
    samples = [
        Sample(g.prompt_ids, g.response_ids, 1.0 if i % 2 else -1.0, 0.7, tuple(g.logprobs))
        for i, g in enumerate(g for row in rows for g in row)
    ]
    learner = Learner(folder, Algorithm(micro_batch=6), threads=1)
    (batch,) = learner._micro_batches(samples)
    assert batch.prefix_ids.numel() >= 16 and batch.prompt_ids.shape[0] == 3
    counts = _prefilled_tokens(learner.model.get_decoder())
    logp = learner._logp(batch)
    assert counts[0] == batch.prefix_ids.numel()
    known = batch.mask.bool()
    assert (logp[known] - batch.sampler[known]).abs().max() < 1e-4  # what the sampler sampled
    order = sorted(samples, key=lambda s: tuple(s.prompt_ids))
    got = [row[batch.mask[i].bool()] for i, row in enumerate(logp)]
    want = full_sequence_logp(learner, order)
    assert max(float((a - b).detach().abs().max()) for a, b in zip(got, want)) < 1e-5
    params = [p for p in learner.model.parameters() if p.requires_grad]
    grad_shared = torch.autograd.grad(sum(r.sum() for r in got), params)
    grad_full = torch.autograd.grad(sum(r.sum() for r in full_sequence_logp(learner, order)), params)
    assert max(float((a - b).abs().max()) for a, b in zip(grad_shared, grad_full)) < 1e-4


def test_two_mini_batches_take_two_optimizer_steps_and_the_clip_binds():
    """PPO mini-batches (algorithm.mini_batches): the second mini-batch sees the policy the first moved,
    so its ratio leaves 1 and, with a large step, the clip binds (one mini-batch: ratio exactly 1)."""
    generations, learner = sampled(0.7, 0.9)
    samples = [Sample(g.prompt_ids, g.response_ids, 1.0 if i % 2 else -1.0, 0.7) for i, g in enumerate(generations)]
    learner.algo = Algorithm(lr=5e-2, mini_batches=2)
    learner.optimizers["shared"].param_groups[0]["lr"] = 5e-2
    steps_before = _adam_steps(learner)
    out = learner.update({"shared": samples})["shared"]
    assert _adam_steps(learner) == steps_before + 2
    assert out["clip_frac"] > 0 and (out["ratio_min"] < 1.0 - 0.2 or out["ratio_max"] > 1.0 + 0.2)
    _, single = sampled(0.7, 0.9)
    single.algo = Algorithm(lr=5e-2)
    one = single.update({"shared": samples})["shared"]
    assert one["clip_frac"] == 0.0 and one["ratio_min"] == one["ratio_max"] == 1.0


def _adam_steps(learner) -> int:
    state = learner.optimizers["shared"].state
    return int(max((float(v["step"]) for v in state.values()), default=0))


def test_the_kl_penalty_gradient_by_hand():
    """k3 per token, exp(ref - logp) - (ref - logp) - 1; its gradient in logp is 1 - exp(ref - logp),
    divided by the normalizer; zero where the policy equals the reference."""
    from mas_lab.algo.loss import kl_penalty

    logp = torch.log(torch.tensor([[0.5, 0.2, 0.9]])).requires_grad_(True)
    ref = torch.log(torch.tensor([[0.25, 0.2, 0.3]]))
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # the third token is padding
    penalty, total = kl_penalty(logp, ref, mask, normalizer=2.0)
    r = torch.tensor([0.25 / 0.5, 1.0])
    expected = (r - torch.log(r) - 1).sum() / 2
    assert torch.allclose(penalty, expected) and abs(total - float(expected * 2)) < 1e-6
    (grad,) = torch.autograd.grad(penalty, logp)
    assert torch.allclose(grad, torch.tensor([[(1 - 0.5) / 2, 0.0, 0.0]]))


def test_the_kl_penalty_pulls_towards_the_initial_policy_and_survives_a_checkpoint(tmp_path):
    """With kl_coef the learner keeps the policy RL started from and reports the penalty (0 at the
    first update, where the policy is the reference); a checkpoint holds the reference, so a
    restored learner's next update is the same as the original's."""
    generations, learner = sampled(0.7, 0.9)
    algo = Algorithm(lr=1e-2, kl_coef=0.5)
    learner.algo = algo
    learner.optimizers["shared"].param_groups[0]["lr"] = 1e-2
    samples = [Sample(g.prompt_ids, g.response_ids, 1.0 if i % 2 else -1.0, 0.7) for i, g in enumerate(generations)]
    first = learner.update({"shared": samples})["shared"]
    assert first["kl_penalty"] == 0.0
    learner.save("shared", str(tmp_path / "ckpt"))
    restored = Learner(resolve("tiny-test"), algo, threads=1)
    restored.load("shared", str(tmp_path / "ckpt"))
    a = learner.update({"shared": samples})["shared"]
    b = restored.update({"shared": samples})["shared"]
    assert a["kl_penalty"] > 0 and a["kl_penalty"] == b["kl_penalty"] and a["loss"] == b["loss"]
    with torch.no_grad():  # the reference stayed where RL started
        assert not torch.equal(next(learner.model.parameters()), next(learner.kl_references["shared"].parameters()))


def test_the_update_reports_the_norm_before_and_after_the_clip_and_how_often_it_bound():
    """grad_norm is the norm before the clip; grad_norm_clipped what the optimizer step used;
    grad_clip_frac the share of optimizer steps the clip scaled down (the credit arms once took
    different effective step sizes: the clip bound on 99-100% of some arms' steps, ~18% of others')."""
    generations, learner = sampled(0.7, 0.9)
    samples = [Sample(g.prompt_ids, g.response_ids, 1.0 if i % 2 else -1.0, 0.7) for i, g in enumerate(generations)]
    learner.algo = Algorithm(grad_clip=1e-6, mini_batches=2)
    tight = learner.update({"shared": samples})["shared"]
    assert tight["grad_norm"] > 1e-6 and tight["grad_norm_clipped"] == 1e-6 and tight["grad_clip_frac"] == 1.0
    _, loose_learner = sampled(0.7, 0.9)
    loose_learner.algo = Algorithm(grad_clip=1e9)
    loose = loose_learner.update({"shared": samples})["shared"]
    assert loose["grad_norm_clipped"] == loose["grad_norm"] > 0 and loose["grad_clip_frac"] == 0.0


def test_the_constant_normaliser_divides_the_summed_loss_by_a_fixed_budget():
    """loss_agg constant (Dr. GRPO): the same samples give token_mean's loss x tokens / loss_tokens,
    so a step whose filter kept fewer tokens takes a proportionally smaller step."""
    generations, learner = sampled(0.7, 0.9)
    samples = [Sample(g.prompt_ids, g.response_ids, 1.0 if i % 2 else -1.0, 0.7) for i, g in enumerate(generations)]
    learner.algo = Algorithm(lr=1e-12)
    mean = learner.update({"shared": samples})["shared"]
    _, other = sampled(0.7, 0.9)
    other.algo = Algorithm(lr=1e-12, loss_agg="constant", loss_tokens=1000)
    constant = other.update({"shared": samples})["shared"]
    assert abs(constant["loss"] - mean["loss"] * mean["tokens"] / 1000) < 1e-6
    assert abs(constant["grad_norm"] - mean["grad_norm"] * mean["tokens"] / 1000) < 1e-4 * mean["grad_norm"]
