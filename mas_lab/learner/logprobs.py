"""Log-probabilities of chosen tokens through the output layer, in row chunks, without keeping the
full-vocabulary logits for the backward pass (`algorithm.logp_chunk`).

The dense path computes logits [N, V] = h W^T for the N response positions (V = 49,152 for SmolLM2),
casts them to float32, divides by the temperature and takes log_softmax; autograd keeps the logits
and the log-softmax output (several [N, V] float tensors) until the backward pass. Here the forward
keeps only each row's log-sum-exp, and the backward recomputes one chunk's logits at a time:

    logp_i = z_i[y_i] - logsumexp(z_i),  z_i = h_i W^T / tau_i
    d logp_i / d z_i = onehot(y_i) - softmax(z_i)
    dh_i = (g_i / tau_i) (onehot(y_i) - softmax(z_i)) W,   dW = sum_i (g_i / tau_i) (onehot(y_i) - softmax(z_i))^T h_i

(the fused linear cross-entropy of Liger-Kernel and Apple's Cut Cross-Entropy, written in plain
torch). The matmuls run in `compute_dtype` (bf16 under the learner's autocast, as the dense path's
autocast linear does), the softmax in float32. Peak memory of the output layer falls from several
N x V floats to one chunk's; the price is one more output-layer matmul per chunk in the backward.
"""

from __future__ import annotations

import torch


class _ChunkedLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, chunk: int, compute_dtype):  # type: ignore[override]
        w = weight.to(compute_dtype)
        picked = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        lse = torch.empty_like(picked)
        for start in range(0, hidden.shape[0], chunk):
            rows = slice(start, start + chunk)
            logits = (hidden[rows].to(compute_dtype) @ w.T).float() / temperature[rows].unsqueeze(-1)
            lse[rows] = torch.logsumexp(logits, dim=-1)
            picked[rows] = logits.gather(-1, targets[rows].unsqueeze(-1)).squeeze(-1) - lse[rows]
        ctx.save_for_backward(hidden, weight, targets, temperature, lse)
        ctx.chunk, ctx.compute_dtype = chunk, compute_dtype
        return picked

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        hidden, weight, targets, temperature, lse = ctx.saved_tensors
        chunk, compute_dtype = ctx.chunk, ctx.compute_dtype
        w = weight.to(compute_dtype)
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = (
            torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if ctx.needs_input_grad[1] else None
        )
        for start in range(0, hidden.shape[0], chunk):
            rows = slice(start, start + chunk)
            h = hidden[rows].to(compute_dtype)
            tau = temperature[rows].unsqueeze(-1)
            logits = (h @ w.T).float() / tau
            # d loss / d logits = (g / tau) * (onehot(y) - softmax(z)), the 1/tau from z = logits / tau
            d = torch.exp(logits - lse[rows].unsqueeze(-1)).neg_()
            d.scatter_add_(-1, targets[rows].unsqueeze(-1), torch.ones_like(lse[rows]).unsqueeze(-1))
            d.mul_((grad[rows] / temperature[rows]).unsqueeze(-1))
            d = d.to(compute_dtype)
            if grad_hidden is not None:
                grad_hidden[rows] = (d @ w).to(hidden.dtype)
            if grad_weight is not None:
                grad_weight += (d.T @ h).float()
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None


def chunked_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: torch.Tensor,
    chunk: int,
    compute_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """log softmax(hidden W^T / temperature)[targets] per row: hidden [N, H], weight [V, H] (the
    output layer's, no bias), targets [N] token ids, temperature [N]; float32 [N]."""
    return _ChunkedLogProbs.apply(hidden, weight, targets, temperature.float(), chunk, compute_dtype or weight.dtype)


def logprobs_from_logits(logits: torch.Tensor, targets: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """The dense path: full logits [N, V] in float32 over the temperature, log_softmax, gather."""
    scaled = logits.float() / temperature.unsqueeze(-1)
    return torch.log_softmax(scaled, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def dense_logprobs(hidden, output_layer, targets, temperature) -> torch.Tensor:
    """The reference the chunked path is tested against: the output layer, then the dense path."""
    return logprobs_from_logits(output_layer(hidden), targets, temperature)
