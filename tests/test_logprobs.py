"""The output layer's log-probabilities in chunks (algorithm.logp_chunk): the same values and
gradients as the dense path, for any chunk size, and the same learner update."""

import pytest
import torch

from mas_lab.learner.logprobs import chunked_logprobs, dense_logprobs


def _inputs(n=11, hidden=16, vocab=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, hidden, generator=g, requires_grad=True)
    head = torch.nn.Linear(hidden, vocab, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(vocab, hidden, generator=g))
    targets = torch.randint(0, vocab, (n,), generator=g)
    temperature = torch.tensor([1.0, 0.7, 1.3] * 4)[:n]
    upstream = torch.randn(n, generator=g)
    return h, head, targets, temperature, upstream


@pytest.mark.parametrize("chunk", [1, 3, 11, 64])
def test_chunked_logprobs_match_the_dense_values_and_gradients(chunk):
    h, head, targets, temperature, upstream = _inputs()
    dense = dense_logprobs(h, head, targets, temperature)
    (dense * upstream).sum().backward()
    want_h, want_w = h.grad.clone(), head.weight.grad.clone()
    h.grad, head.weight.grad = None, None
    chunked = chunked_logprobs(h, head.weight, targets, temperature, chunk)
    (chunked * upstream).sum().backward()
    assert torch.allclose(chunked, dense, atol=1e-5)
    assert torch.allclose(h.grad, want_h, atol=1e-5) and torch.allclose(head.weight.grad, want_w, atol=1e-4)
    assert (chunked <= 0).all()


def test_chunked_logprobs_in_bf16_agree_with_the_autocast_path_to_bf16_precision():
    h, head, targets, temperature, upstream = _inputs(n=9, hidden=32, vocab=80, seed=1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        dense = dense_logprobs(h, head, targets, temperature)
    (dense * upstream).sum().backward()
    want_h = h.grad.clone()
    h.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        chunked = chunked_logprobs(h, head.weight, targets, temperature, 4, torch.bfloat16)
    (chunked * upstream).sum().backward()
    assert torch.allclose(chunked, dense, atol=1e-5)  # the same bf16 logits, the same float softmax
    assert torch.allclose(h.grad, want_h, rtol=0.05, atol=0.05 * float(want_h.abs().max()))


def test_a_learner_with_chunked_logprobs_makes_the_same_update():
    """The same loss and gradient norm as the dense path, and the same step to rounding."""
    from mas_lab.config import Algorithm
    from mas_lab.learner.learner import Learner
    from mas_lab.learner.samples import Sample
    from mas_lab.modeling.models import resolve

    folder = resolve("tiny-test")
    samples = [Sample([1, 2, 3 + i % 2], [4, 5, 6 + i][: 1 + i % 3], 1.0 if i % 2 else -0.5, 0.8) for i in range(6)]
    results = []
    for chunk in (0, 2):
        torch.manual_seed(0)
        learner = Learner(folder, Algorithm(lr=1e-2, logp_chunk=chunk, micro_batch=4), threads=1)
        out = learner.update({"shared": samples})["shared"]
        results.append((out, {k: v.detach().clone() for k, v in learner.model.state_dict().items()}))
    (dense, dense_w), (chunked, chunked_w) = results
    assert chunked["loss"] == pytest.approx(dense["loss"], abs=1e-6)
    assert chunked["grad_norm"] == pytest.approx(dense["grad_norm"], rel=1e-4)
    # AdamW moves every weight by about lr = 1e-2 (g / sqrt(v)): float noise in a near-zero
    # gradient entry shows there, so the weights agree to a few % of a step rather than bitwise
    assert max(float((chunked_w[k] - dense_w[k]).abs().max()) for k in dense_w) < 5e-4
