"""What the learner optimises is what the sampler sampled (learning issue, section 1)."""
import torch

from mas_lab.config import Algorithm, Sampling
from mas_lab.envs.games import extract_code
from mas_lab.learner.learner import Learner
from mas_lab.learner.samples import Sample
from mas_lab.models import resolve
from mas_lab.rollout.engine import HFEngine, stop_ids

PROMPTS = [[{"role": "user", "content": "write a"}], [{"role": "system", "content": "be brief"},
                                                      {"role": "user", "content": "a longer prompt, please answer"}]]


def sampled(temperature: float, top_p: float):
    folder = resolve("tiny-test")
    engine = HFEngine(folder, threads=1)
    rows = engine.generate("shared", PROMPTS, 3, Sampling(temperature=temperature, top_p=top_p, max_new_tokens=16), seed=3)
    learner = Learner(folder, Algorithm(), threads=1)
    return [g for row in rows for g in row], learner


def test_the_learners_logprobs_equal_the_samplers_at_temperature_and_top_p():
    generations, learner = sampled(0.7, 0.9)
    assert all(len(g.logprobs) == len(g.response_ids) > 0 for g in generations)
    samples = [Sample(g.prompt_ids, g.response_ids, 0.0, 0.7, tuple(g.logprobs)) for g in generations]
    ids, attention, mask, _, temperature, sampler = learner._batch(samples)
    with torch.no_grad():
        logp = learner._logp(ids, attention, mask, temperature)
    known = mask.bool()
    assert (logp[known] - sampler[known]).abs().max() < 1e-4
    at_one = [Sample(s.prompt_ids, s.response_ids, 0.0, 1.0, s.sampler_logprobs) for s in samples]
    ids, attention, mask, _, temperature, sampler = learner._batch(at_one)
    with torch.no_grad():
        wrong = learner._logp(ids, attention, mask, temperature)
    assert (wrong[known] - sampler[known]).abs().max() > 1e-2  # temperature 1 was the old mistake


def test_the_update_reports_the_rollout_training_mismatch():
    generations, learner = sampled(0.7, 0.9)
    samples = [Sample(g.prompt_ids, g.response_ids, 1.0 if i % 2 else -1.0, 0.7, tuple(g.logprobs))
               for i, g in enumerate(generations)]
    result = learner.update({"shared": samples})["shared"]
    assert 0.0 <= result["mismatch_abs"] < 1e-4 and 0.0 <= result["mismatch_kl"] < 1e-6
    without = learner.update({"shared": [Sample(s.prompt_ids, s.response_ids, s.advantage) for s in samples]})["shared"]
    assert "mismatch_abs" not in without  # nothing to compare with


def test_greedy_candidates_carry_no_logprobs():
    folder = resolve("tiny-test")
    rows = HFEngine(folder, threads=1).generate("shared", PROMPTS, 1, Sampling(temperature=0.0, max_new_tokens=8), seed=0)
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
    samples = [Sample(g.prompt_ids, g.response_ids, 1.0 if i % 2 else -1.0, 0.7, tuple(g.logprobs))
               for i, g in enumerate(generations)]
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
