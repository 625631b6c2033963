"""algorithm.adamw: the fused AdamW makes the update foreach makes, up to float rounding, and a
resumed run may not switch implementation (it would not continue exactly)."""

import pytest
import torch

from mas_lab.config import Algorithm
from mas_lab.learner.learner import Learner
from mas_lab.learner.samples import Sample
from mas_lab.modeling.models import resolve
from mas_lab.runs import FIXED_ON_RESUME


def test_fused_adamw_moves_the_weights_as_foreach_does_up_to_rounding():
    samples = [Sample([1, 2, 3 + i % 2], [4, 5, 6 + i][: 1 + i % 3], 1.0 if i % 2 else -0.5, 0.8) for i in range(6)]
    weights = {}
    for kind in ("foreach", "fused"):
        torch.manual_seed(0)
        learner = Learner(resolve("tiny-test"), Algorithm(lr=1e-3, adamw=kind, micro_batch=4), threads=1)
        start = {k: v.detach().clone() for k, v in learner.model.state_dict().items()}
        for _ in range(3):
            learner.update({"shared": samples})
        weights[kind] = {k: v.detach().clone() for k, v in learner.model.state_dict().items()}
        assert bool(learner.optimizers["shared"].defaults.get("fused")) is (kind == "fused")
    # three steps of about lr = 1e-3 each: the two agree to float rounding, far below one step
    gap = max(float((weights["fused"][k] - weights["foreach"][k]).abs().max()) for k in weights["foreach"])
    assert gap < 1e-5
    moved = max(float((weights["foreach"][k] - start[k]).abs().max()) for k in start)
    assert moved > 1e-3 and gap < moved / 100


def test_a_resume_keeps_its_adamw():
    assert "algorithm.adamw" in FIXED_ON_RESUME
    with pytest.raises(ValueError):
        Algorithm(adamw="sgd")
