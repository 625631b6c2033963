"""The FLOPs a step stores are counted, and counted right: the meter (mas_lab/modeling/flops.py)
agrees with torch's own FlopCounterMode on a real learner update and a real sampling loop of the
tiny model, once the CPU attention kernel FlopCounterMode does not know is given torch's own rule
for attention (2 batched matmuls forward, 4 backward)."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from mas_lab.config import Algorithm, Lora, Sampling
from mas_lab.learner.learner import Learner
from mas_lab.learner.samples import Sample
from mas_lab.modeling import flops
from mas_lab.modeling.models import resolve
from mas_lab.rollout.engine import HFEngine

aten = torch.ops.aten


def _attention(query, key, *args, **kwargs):
    batch, heads, queries, width = query
    return 4 * batch * heads * queries * key[-2] * width


def _attention_backward(grad_out, query, key, *args, **kwargs):
    batch, heads, queries, width = query
    return 8 * batch * heads * queries * key[-2] * width


def torch_count() -> FlopCounterMode:
    return FlopCounterMode(
        display=False,
        custom_mapping={
            aten._scaled_dot_product_flash_attention_for_cpu: _attention,
            aten._scaled_dot_product_flash_attention_for_cpu_backward: _attention_backward,
        },
    )


def _samples(n=6):
    # two distinct prompts with a shared prefix, responses of different lengths (padding), K per prompt
    return [
        Sample([1, 2, 3, 4, 5, 6, 7, 8, 9 + i % 2], [4, 5, 6, 7][: 1 + i % 4], 1.0 if i % 2 else -0.5, 0.8)
        for i in range(n)
    ]


@pytest.mark.parametrize("chunk", [0, 3])
def test_a_learner_update_counts_what_torch_counts(chunk, monkeypatch):
    from mas_lab.modeling import prefill

    monkeypatch.setattr(prefill, "MIN_SHARED_PREFIX", 2)  # the shared-prefix call runs too
    learner = Learner(resolve("tiny-test"), Algorithm(lr=1e-3, logp_chunk=chunk, micro_batch=4), threads=1)
    with torch_count() as counter:
        out = learner.update({"shared": _samples()})["shared"]
    assert out["learner_gflop"] * 1e9 == pytest.approx(counter.get_total_flops(), rel=1e-9)
    assert out["learner_gflop"] > 0 and out["learner_gflops_per_s"] > 0


def test_a_sampling_loop_counts_what_torch_counts(monkeypatch):
    """Shared prefix, distinct prompts, K candidates, rows leaving the batch as they finish: the
    candidates' shares add up to the call's count."""
    from mas_lab.modeling import prefill

    monkeypatch.setattr(prefill, "MIN_SHARED_PREFIX", 2)
    engine = HFEngine(resolve("tiny-test"), threads=1)
    prompts = [[{"role": "user", "content": f"go from a to b, case {i}"}] for i in range(3)]
    with torch_count() as counter:
        rows = engine.generate("shared", prompts, 4, Sampling(temperature=1.0, max_new_tokens=12), seed=3)
    lengths = {len(g.response_ids) for row in rows for g in row}
    assert len(lengths) > 1  # some rows left the batch early: the count follows the shrinking batch
    assert sum(g.flops for row in rows for g in row) == pytest.approx(counter.get_total_flops(), rel=1e-9)


def test_lora_updates_are_counted_within_a_few_percent():
    """With frozen base weights autograd skips some input gradients the meter counts (the first
    layer's, whose input needs none): an upper bound within a few percent, not the exact count."""
    learner = Learner(resolve("tiny-test"), Algorithm(lr=1e-3, micro_batch=4), threads=1, policies={"a": Lora(rank=4)})
    with torch_count() as counter:
        out = learner.update({"a": _samples()})["a"]
    counted = counter.get_total_flops()
    assert counted <= out["learner_gflop"] * 1e9 <= 1.1 * counted


def test_the_peak_is_kept_per_machine_dtype_threads_and_shape(tmp_path, monkeypatch):
    monkeypatch.setenv("MAS_LAB_CACHE", str(tmp_path))
    dims = flops.Dims(linear=1, trained_linear=1, attention=1, head=1, head_trained=True, hidden=64, intermediate=128)
    key = flops.machine_key("cpu", "float32", 2, dims)
    assert "float32" in key and "2 threads" in key and "64x128" in key
    assert flops.cached_peak(key) is None
    measured = flops.measure_peak(dims, seconds=0.05, tokens=32)
    assert measured > 0
    flops.save_peak(key, measured)
    assert flops.cached_peak(key) == measured
    assert flops.cached_peak(flops.machine_key("cpu", "bfloat16", 2, dims)) is None


def test_the_summary_line_reads_the_rates_and_shares_of_every_policy():
    from mas_lab.analysis.reporting import utilisation_text

    steps = [
        {"rollout_gflops_per_s/a": 50.0, "rollout_util/a": 0.1, "learner_gflops_per_s/a": 100.0},
        {"rollout_gflops_per_s/a": 70.0, "rollout_util/a": 0.3, "learner_gflops_per_s/a": 120.0},
    ]
    assert utilisation_text(steps) == (
        "rollout a 60.0 GFLOP/s (20% of peak); learner a 110.0 GFLOP/s (peak not measured)"
    )
    assert utilisation_text([{"loss/a": 1.0}]) == ""
