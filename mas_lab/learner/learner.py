"""Learner: holds one policy's trainable model and optimizer; a plain class Ray wraps as an actor.

`update` applies the token-level clipped objective (paper Eq. 5, algo/loss.py) to the samples of
the roles this policy serves (routing by sigma happens in the trainer). With one epoch and the
whole batch as one mini-batch, logp_old is logp.detach() of the same forward pass (docs/algorithm.md);
with more epochs or mini-batches, logp_old is computed once before the first update.
"""

from __future__ import annotations

import copy
import json
import math
import os
import time
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from mas_lab.actors.placement import node_id, set_threads
from mas_lab.algo.loss import clipped_policy_loss, kl_penalty
from mas_lab.config import Algorithm, Lora
from mas_lab.learner.logprobs import chunked_logprobs, logprobs_from_logits
from mas_lab.learner.samples import Sample
from mas_lab.modeling import lora, precision
from mas_lab.modeling.flops import FlopMeter, peak_for
from mas_lab.modeling.prefill import after_prefix, cache_keyword, prefill_prefix, shared_prefix
from mas_lab.records.background import Background
from mas_lab.training.metric_names import LEARNER_FLOPS

T = TypeVar("T")


class Learner:
    """One base model and the policies trained on it: a single full policy, or one LoRA adapter
    per policy (each with its own optimizer, so an update touches only its adapter)."""

    def __init__(
        self,
        model_dir: str,
        algorithm: Algorithm,
        dtype: str = "float32",
        threads: int = 0,
        seed: int = 0,
        policies: dict[str, Lora | None] | None = None,
        init_from: dict[str, str] | None = None,
        device: str = "cpu",
        lrs: dict[str, float] | None = None,
    ):
        # lazy: transformers (and torch), only when a model or tokenizer is built
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging

        logging.disable_progress_bar()
        logging.set_verbosity_error()
        set_threads(threads)
        torch.manual_seed(seed)
        self.algo = algorithm
        policies = policies or {"shared": None}
        self.adapters = {name: spec for name, spec in policies.items() if spec}
        if self.adapters and len(self.adapters) != len(policies):
            raise ValueError("a learner serves either one full policy or LoRA adapters only")
        if not self.adapters and len(policies) != 1:
            raise ValueError("a learner serves one full policy")
        # master weights stay float32; dtype bfloat16 means bf16 autocast for the forward/backward
        self.device = torch.device(device)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.model = model.to(self.device)  # type: ignore[arg-type]  # transformers types .to() for models only
        self.model.config.use_cache = False
        if self.adapters:
            self.model = lora.attach(self.model, self.adapters)
            params = {name: lora.adapter_parameters(self.model, name) for name in self.adapters}
        else:
            params = {next(iter(policies)): [p for p in self.model.parameters() if p.requires_grad]}
        self.model.train()
        self.precision = precision.report(dtype, device)
        self.autocast = self.precision["dtype"] == "bfloat16"
        self.meter = FlopMeter(self.model)  # the FLOPs of every update (modeling/flops.py)
        # algorithm.adamw: foreach, the multi-tensor AdamW, bitwise the per-tensor loop torch runs on a CPU
        # by default and 1.21x faster on SmolLM2-135M; fused, one kernel, 4.6x faster than foreach and
        # equal to it up to float rounding (benchmarks/optimizer_step.py, docs/measurements.md)
        fused = algorithm.adamw == "fused"
        self.optimizers = {
            name: torch.optim.AdamW(
                group,
                lr=(lrs or {}).get(name) or algorithm.lr,
                weight_decay=algorithm.weight_decay,
                foreach=None if fused else True,
                fused=True if fused else None,
            )
            for name, group in params.items()
        }
        self.params = params
        # policy -> (probe samples, their log-probs under the initial policy): KL to the initial policy
        self.reference: dict[str, tuple[list[Sample], list[torch.Tensor]]] = {}
        if algorithm.kl_coef and self.adapters:
            raise ValueError("the KL penalty (algorithm.kl_coef) is implemented for full policies, not LoRA adapters")
        self.kl_references: dict[str, torch.nn.Module] = {}  # policy -> frozen copy (algorithm.kl_coef)
        for name, folder in (init_from or {}).items():
            self.load(name, folder, optimizer=False)
        self.version = 0
        self._saves: list[Background] = []  # background checkpoint writes

    def _batch(self, samples: list[Sample]) -> "Batch":
        """The tokens all its distinct prompts start with, once; each distinct prompt's remainder
        once (left-padded); every response (right-padded) with the row of its prompt; per response
        token: loss mask, temperature, sampler log-prob (NaN if unknown)."""
        rows: dict[tuple[int, ...], int] = {}
        which = [rows.setdefault(tuple(s.prompt_ids), len(rows)) for s in samples]
        shared = shared_prefix(list(rows))
        prompt_ids, prompt_mask, prompt_positions = after_prefix(list(rows), 0, shared)
        prefix_ids = torch.tensor(next(iter(rows))[:shared], dtype=torch.long)
        r_width = max(max(len(s.response_ids) for s in samples), 1)
        response_ids = torch.zeros(len(samples), r_width, dtype=torch.long)
        mask = torch.zeros(len(samples), r_width)
        temperature = torch.ones(len(samples), r_width)
        sampler = torch.full((len(samples), r_width), float("nan"))
        for row, s in enumerate(samples):
            n = len(s.response_ids)
            response_ids[row, :n] = torch.tensor(s.response_ids, dtype=torch.long)
            mask[row, :n] = 1.0
            temperature[row, :n] = s.temperature or 1.0
            if len(s.sampler_logprobs) == n and n:
                sampler[row, :n] = torch.tensor(s.sampler_logprobs)
        advantages = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
        return Batch(
            prefix_ids,
            prompt_ids,
            prompt_mask,
            prompt_positions,
            torch.tensor(which),
            response_ids,
            mask,
            advantages,
            temperature,
            sampler,
        ).to(self.device)

    def _micro_batches(self, samples: list[Sample]) -> list["Batch"]:
        """Samples in micro-batches of at most `micro_batch` (`pack_groups`), grouped by prompt;
        prompts in token order, so a micro-batch holds prompts of one role (one system prompt),
        whose common prefix is computed once."""
        by_prompt: dict[tuple[int, ...], list[Sample]] = {}
        for s in samples:
            by_prompt.setdefault(tuple(s.prompt_ids), []).append(s)
        groups = [group for _, group in sorted(by_prompt.items(), key=lambda item: item[0])]
        return [self._batch(chunk) for chunk in pack_groups(groups, self.algo.micro_batch)]

    def _logp(self, batch: "Batch", model: "torch.nn.Module | None" = None) -> torch.Tensor:
        """Log-probabilities of the response tokens ([samples, response width], zero at padding)
        under the sampled distribution, softmax(logits / temperature) (as TRL and verl; top-p
        truncation is not modelled).

        The K candidates of a group share their prompt (AT-GRPO samples them from one observation,
        paper Sec. 4.1), so each distinct prompt runs through the model once, with gradients, and
        its keys and values are repeated for its candidates; the responses then run on top of them.
        The prefix all prompts of the micro-batch share (one role's system prompt) runs once before
        them, its keys and values repeated for every prompt (gradients flow back through the repeat).
        The first response token is predicted at the prompt's last position. The output layer runs
        only at response positions."""
        # lazy: transformers (and torch), only when a model or tokenizer is built
        from transformers import DynamicCache

        model_: Any = model if model is not None else self.model
        decoder = model_.get_decoder()
        cache = DynamicCache()
        cache_arg = {cache_keyword(decoder): cache}
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            if batch.prefix_ids.numel():
                prefill_prefix(decoder, batch.prefix_ids, len(batch.prompt_ids), cache, cache_arg)
            prompt = decoder(
                input_ids=batch.prompt_ids,
                attention_mask=batch.prompt_mask,
                position_ids=batch.prompt_positions,
                use_cache=True,
                **cache_arg,
            ).last_hidden_state
            cache.batch_select_indices(batch.which)  # each candidate attends to its own prompt's keys/values
            lengths = batch.prompt_mask.sum(-1)[batch.which]
            width = batch.response_ids.shape[1]
            # response padding comes after the real tokens, so causal attention keeps it out of them
            attention = torch.cat([batch.prompt_mask[batch.which], torch.ones_like(batch.response_ids)], dim=1)
            response = decoder(
                input_ids=batch.response_ids,
                attention_mask=attention,
                position_ids=lengths.unsqueeze(1) + torch.arange(width, device=self.device),
                use_cache=True,
                **cache_arg,
            ).last_hidden_state
            hidden = torch.cat([prompt[batch.which, -1:], response[:, :-1]], dim=1)
            where = batch.mask.bool()
            head = model_.get_output_embeddings()
            targets, temperature = batch.response_ids[where], batch.temperature[where]
            chunked = self.algo.logp_chunk > 0 and type(head) is torch.nn.Linear and head.bias is None
            if chunked:  # the full-vocabulary logits never kept: learner/logprobs.py
                dtype = torch.bfloat16 if self.autocast else head.weight.dtype  # as the autocast linear
                picked = chunked_logprobs(hidden[where], head.weight, targets, temperature, self.algo.logp_chunk, dtype)
                if model_ is self.model:  # the output layer's matmuls, without a call to the layer
                    self.meter.head_rows(len(targets), torch.is_grad_enabled(), recomputed=True)
            else:
                logits = head(hidden[where])
        if not chunked:  # outside autocast: the softmax in float32
            picked = logprobs_from_logits(logits, targets, temperature)
        return torch.zeros(where.shape, dtype=picked.dtype, device=self.device).masked_scatter(where, picked)

    def update(self, samples: dict[str, list[Sample]]) -> dict[str, dict[str, float]]:
        """Update each named policy on its own samples (routing by sigma happened upstream)."""
        out = {}
        for name, batch in samples.items():
            if self.adapters:
                lora.use(self.model, name)
            out[name] = self._update_policy(name, batch)
        self.version += 1
        return out

    def _update_policy(self, name: str, samples: list[Sample]) -> dict[str, float]:
        """One policy update on this step's samples: `epochs` passes, each over `mini_batches`
        mini-batches with one optimizer step each (PPO, Schulman et al. 2017; the paper's batch 128
        / mini-batch 64). Sample i goes to mini-batch i mod n, so each holds every role and group.
        With one epoch and one mini-batch, logp_old is logp.detach() of the same forward pass;
        otherwise it is computed once before the first optimizer step, so the ratio moves and the
        clip binds. Returns loss, clip fraction, grad norm (of the last optimizer step), etc."""
        started = time.perf_counter()
        optimizer, params = self.optimizers[name], self.params[name]
        if self.adapters:
            self.meter.refresh()  # the adapter in use is the one trained
        self.meter.take()
        if not samples:
            return {
                "loss": 0.0,
                "clip_frac": 0.0,
                "grad_norm": 0.0,
                "grad_norm_clipped": 0.0,
                "grad_clip_frac": 0.0,
                "samples": 0,
                "tokens": 0,
                "learner_s": 0.0,
            }
        algo = self.algo
        parts = max(1, min(algo.mini_batches, len(samples)))
        minis = [self._micro_batches(samples[i::parts]) for i in range(parts)]
        tokens = sum(float(m.mask.sum()) for micro in minis for m in micro)
        mismatch, tis = _Mismatch(), _TruncatedIS()
        old = None
        if algo.epochs > 1 or parts > 1:
            with torch.no_grad():
                old = [[self._logp(batch) for batch in micro] for micro in minis]
        kl_initial = self._kl_to_initial(name, samples)
        role_norms = self._role_grad_norms(samples, params) if algo.role_grad_norms else {}
        reference = self._kl_reference(name, samples)
        total_loss, clipped, grad_norm, nll, kl_sum = 0.0, 0.0, 0.0, 0.0, 0.0
        optimizer_steps, clip_bound = 0, 0  # how often the gradient-norm clip scaled the step down
        ratio_sum, ratio_min, ratio_max = 0.0, math.inf, -math.inf
        for epoch in range(algo.epochs):
            epoch_loss = 0.0
            for m, micro in enumerate(minis):
                optimizer.zero_grad(set_to_none=True)
                part_tokens = sum(float(b.mask.sum()) for b in micro)
                normalizer = {
                    "token_mean": part_tokens,
                    "seq_mean_token_mean": float(sum(len(b.advantages) for b in micro)),
                    "constant": float(algo.loss_tokens or 1) / parts,
                }[algo.loss_agg]
                for i, batch in enumerate(micro):
                    logp = self._logp(batch)
                    if epoch == 0:
                        mismatch.add(logp.detach(), batch.sampler, batch.mask)
                        nll -= float((logp.detach() * batch.mask).sum())
                    logp_old = old[m][i] if old is not None else logp.detach()
                    weights = None
                    if algo.tis_cap is not None:
                        weights = truncated_is_weights(logp_old, batch.sampler, algo.tis_cap)
                        if epoch == 0:
                            tis.add(weights, batch.sampler, batch.mask, algo.tis_cap)
                    loss, stats = clipped_policy_loss(
                        logp,
                        logp_old,
                        batch.advantages,
                        batch.mask,
                        eps_low=algo.clip_eps_low,
                        eps_high=algo.clip_eps_high,
                        dual_clip=algo.dual_clip,
                        agg=algo.loss_agg,
                        normalizer=normalizer,
                        is_weights=weights,
                    )
                    if reference is not None:
                        with torch.no_grad():
                            logp_ref = self._logp(batch, reference)
                        penalty, kl_tokens = kl_penalty(logp, logp_ref, batch.mask, normalizer)
                        loss = loss + algo.kl_coef * penalty
                        kl_sum += kl_tokens
                    loss.backward()
                    epoch_loss += float(loss.detach())
                    clipped += stats["clipped_tokens"]
                    ratio_sum += stats["ratio_sum"]
                    ratio_min = min(ratio_min, stats.get("ratio_min", math.inf))
                    ratio_max = max(ratio_max, stats.get("ratio_max", -math.inf))
                grad_norm = float(torch.nn.utils.clip_grad_norm_(params, algo.grad_clip))
                if math.isfinite(grad_norm):
                    optimizer.step()
                    optimizer_steps += 1
                    clip_bound += grad_norm > algo.grad_clip
            total_loss = epoch_loss / parts
        learner_s = time.perf_counter() - started
        return {
            "loss": total_loss,
            "clip_frac": clipped / max(tokens * algo.epochs, 1.0),
            "grad_norm": grad_norm,  # before the clip, of the last optimizer step
            # the norm the optimizer step used (after the clip), and the share of optimizer steps the clip bound
            "grad_norm_clipped": min(grad_norm, algo.grad_clip) if math.isfinite(grad_norm) else grad_norm,
            "grad_clip_frac": clip_bound / optimizer_steps if optimizer_steps else 0.0,
            "samples": len(samples),
            "tokens": tokens,
            "nll": nll / tokens if tokens else 0.0,  # mean -log p of the trained tokens before the update
            "learner_s": learner_s,
            **self._utilisation(self.meter.take(), learner_s),
            **mismatch.metrics(),
            **tis.metrics(),
            **(
                {"ratio_mean": ratio_sum / (tokens * algo.epochs), "ratio_min": ratio_min, "ratio_max": ratio_max}
                if tokens
                else {}
            ),
            **({"kl_initial": kl_initial} if kl_initial is not None else {}),
            **{f"grad_norm_role/{role}": norm for role, norm in role_norms.items()},
            **({"kl_penalty": kl_sum / (tokens * algo.epochs)} if reference is not None and tokens else {}),
        }

    def _utilisation(self, flops: float, seconds: float) -> dict[str, float]:
        """The update's FLOPs (counted: modeling/flops.py), their rate, and that rate against this
        machine's measured matmul peak at the model's shapes (omitted where not measured:
        benchmarks/matmul_peak.py)."""
        gflop, per_s, util = LEARNER_FLOPS
        rate = flops / seconds / 1e9 if seconds > 0 else 0.0
        peak = peak_for(self.meter.dims, str(self.precision["dtype"]), self.device.type)
        return {gflop: flops / 1e9, per_s: rate, **({util: rate / peak} if peak else {})}

    def _role_grad_norms(self, samples: list[Sample], params) -> dict[str, float]:
        """The gradient norm of each role's own samples, before the update (a diagnostic: Dr. MAS,
        arXiv 2602.08847, reports that one agent's gradient dominating a shared policy shows as
        spikes): per role, the policy-gradient loss of its samples alone (ratio 1: the clipped
        objective's gradient at the old policy), token-mean over that role's tokens, backward, the
        total norm; the gradients are cleared afterwards. Empty when the samples hold one role (the
        policy's grad_norm is that role's) or are demonstrations."""
        roles = sorted({s.role for s in samples})
        if len(roles) < 2 or any(s.demonstration for s in samples):
            return {}
        out = {}
        for role in roles:
            self._clear_grads(params)
            micro = self._micro_batches([s for s in samples if s.role == role])
            normalizer = sum(float(b.mask.sum()) for b in micro)
            for batch in micro:
                logp = self._logp(batch)
                loss, _ = clipped_policy_loss(
                    logp, logp.detach(), batch.advantages, batch.mask, agg="token_mean", normalizer=normalizer
                )
                loss.backward()
            out[role] = float(torch.nn.utils.clip_grad_norm_(params, math.inf))
        self._clear_grads(params)
        return out

    @staticmethod
    def _clear_grads(params) -> None:
        for p in params:
            p.grad = None

    def _kl_reference(self, name: str, samples: list[Sample]) -> "torch.nn.Module | None":
        """The frozen policy the KL penalty (algorithm.kl_coef) pulls towards: a copy of policy
        `name` as RL starts (after the format warm-up, which trains on demonstrations), kept in
        memory and in every checkpoint (reference.safetensors), so a resume is exact."""
        if not self.algo.kl_coef or any(s.demonstration for s in samples):
            return None
        if name not in self.kl_references:
            self.kl_references[name] = _frozen_copy(self.model)
        return self.kl_references[name]

    @torch.no_grad()
    def _kl_to_initial(self, name: str, samples: list[Sample]) -> float | None:
        """KL(initial || current) of policy `name`, estimated on a fixed probe: the first
        `kl_probe` sampled replies this learner trained on (drawn from the policy RL started from:
        after the format warm-up, when there is one), whose
        log-probs under the initial policy were kept. k3 estimator per token, r = p_now / p_init:
        E[r - 1 - log r] >= 0 (Schulman 2020); the KL penalty's reference of the GRPO paper (Shao et
        al. 2024, Eq. 4) as a diagnostic only: no reference model stays in memory."""
        if not self.algo.kl_probe or any(s.demonstration for s in samples):
            return None  # the probe is the first sampled replies: the policy RL starts from is the reference
        if name not in self.reference:
            probe = samples[: self.algo.kl_probe]
            self.reference[name] = (probe, [self._logp(batch) for batch in self._micro_batches(probe)])
            return 0.0
        probe, initial = self.reference[name]
        total, tokens = 0.0, 0.0
        batches = self._micro_batches(probe)
        if [tuple(b.mask.shape) for b in batches] != [tuple(t.shape) for t in initial]:
            raise RuntimeError(
                f"policy '{name}': the KL probe's initial log-probs were stored in micro-batches of "
                "another shape (a checkpoint written by another version of the learner)"
            )
        for batch, logp0 in zip(batches, initial):
            delta = (self._logp(batch) - logp0).double()[batch.mask.bool()]
            total += float((torch.exp(delta) - 1 - delta).sum())
            tokens += float(batch.mask.sum())
        return total / tokens if tokens else None

    def weights(self, name: str) -> dict[str, torch.Tensor]:
        """What the rollout engine needs for policy `name` (weight sync): its adapter, or the full
        state dict, in the engine's dtype (bf16 halves what crosses the object store)."""
        dtype = torch.bfloat16 if self.autocast else None
        state = lora.adapter_state(self.model, name) if self.adapters else self.model.state_dict()
        return {k: v.detach().to("cpu", dtype) for k, v in state.items()}

    def save(self, name: str, path: str, background: bool = False) -> None:
        """Policy `name`'s weights or adapter (safetensors), its optimizer state, the torch RNG.
        `background`: copy them now (a snapshot in memory) and write the files in a thread while
        training goes on; `wait_saves` returns when every such write is on disk."""
        snapshot = self._snapshot(name, copy=background)
        if not background:
            _write_policy(snapshot, path)
            return
        self._saves.append(Background(lambda: _write_policy(snapshot, path), name=f"save-{name}"))

    def wait_saves(self) -> None:
        """Wait for the background writes of `save(..., background=True)`; raise the first error."""
        saves, self._saves = self._saves, []
        for save in saves:
            save.result()

    def _snapshot(self, name: str, copy: bool) -> dict:
        """What `save` writes, as tensors (copies when the files are written later)."""
        take = (lambda t: t.detach().to("cpu", copy=True)) if copy else (lambda t: t.detach().cpu())
        if self.adapters:
            tensors = {k: take(v).contiguous() for k, v in lora.adapter_state(self.model, name).items()}
            adapter = self.adapters[name].model_dump(mode="json")
        else:
            tensors, seen = {}, set()
            for key, value in self.model.state_dict().items():
                if value.data_ptr() in seen:  # a tied weight (the output layer is the embedding): stored once
                    continue
                seen.add(value.data_ptr())
                tensors[key] = take(value)
            adapter = None
        optimizer = self.optimizers[name].state_dict()
        if copy:
            optimizer = {
                "state": {
                    i: {k: take(v) if torch.is_tensor(v) else v for k, v in entry.items()}
                    for i, entry in optimizer["state"].items()
                },
                "param_groups": [dict(group) for group in optimizer["param_groups"]],
            }
        reference = self.reference.get(name)
        learner: dict[str, Any] = {
            "optimizer": optimizer,
            "torch_rng": torch.get_rng_state(),
            "version": self.version,
            "kl_probe": None
            if reference is None
            else {
                "samples": [[s.prompt_ids, s.response_ids, s.temperature] for s in reference[0]],
                "logp": [take(t) for t in reference[1]],
            },
        }
        kl_reference = self.kl_references.get(name)
        if kl_reference is not None:
            seen = set()
            learner["kl_reference"] = {}
            for key, value in kl_reference.state_dict().items():
                if value.data_ptr() not in seen:
                    seen.add(value.data_ptr())
                    learner["kl_reference"][key] = take(value)
        return {"tensors": tensors, "adapter": adapter, "learner": learner}

    def load(self, name: str, path: str, optimizer: bool = True) -> int:
        """Load policy `name` from a saved folder; `optimizer=False` (init_from) loads weights only."""
        # lazy: safetensors and torch, only where weights are read or written
        from safetensors.torch import load_file, load_model

        adapter_file = os.path.join(path, "adapter.safetensors")
        if self.adapters:
            if not os.path.isfile(adapter_file):
                raise FileNotFoundError(f"{path}: no adapter.safetensors (policy '{name}' is a LoRA adapter)")
            lora.load_adapter_state(self.model, name, load_file(adapter_file))
        else:
            if not os.path.isfile(os.path.join(path, "model.safetensors")):
                raise FileNotFoundError(f"{path}: no model.safetensors (policy '{name}' is a full model)")
            load_model(self.model, os.path.join(path, "model.safetensors"))
        if optimizer:
            state = torch.load(os.path.join(path, "learner.pt"), weights_only=True, map_location=self.device)
            self.optimizers[name].load_state_dict(state["optimizer"])
            torch.set_rng_state(state["torch_rng"].cpu())  # map_location may have moved it onto the GPU
            self.version = state["version"]
            probe = state.get("kl_probe")  # absent in checkpoints from before the KL diagnostic
            if probe:
                samples = [Sample(list(p), list(r), 0.0, t) for p, r, t in probe["samples"]]
                self.reference[name] = (samples, list(probe["logp"]))
            if state.get("kl_reference"):
                reference = _frozen_copy(self.model)
                reference.load_state_dict(state["kl_reference"], strict=False)
                self.kl_references[name] = reference
        return self.version

    def ready(self) -> bool:
        return True

    def precision_report(self) -> dict[str, object]:
        """The dtype this learner computes in, as resolved on its device (mas_lab/modeling/precision.py)."""
        return self.precision

    def node(self) -> str:
        return node_id()


def pack_groups(groups: list[list[T]], size: int) -> list[list[T]]:
    """Groups (the K candidates of one prompt) in order into chunks of at most `size`, a group kept
    in one chunk where it fits (so its prompt is computed once per chunk), split in pieces of `size`
    where it does not. benchmarks/padding_share.py replays the learner's layout with it."""
    chunks: list[list[T]] = []
    current: list[T] = []
    for group in groups:
        for i in range(0, len(group), size):
            part = group[i : i + size]
            if current and len(current) + len(part) > size:
                chunks.append(current)
                current = []
            current = current + part
    if current:
        chunks.append(current)
    return chunks


class _Mismatch:
    """Rollout / training mismatch over the tokens whose sampler log-probs are known, before the
    update: mean |logp_learner - logp_sampler| and the k3 estimate of KL(sampler || learner),
    E[r - 1 - log r] with r = p_learner / p_sampler (Schulman 2020), which is >= 0 per token."""

    def __init__(self) -> None:
        self.tokens, self.abs_sum, self.kl_sum = 0, 0.0, 0.0

    def add(self, learner: torch.Tensor, sampler: torch.Tensor, mask: torch.Tensor) -> None:
        known = mask.bool() & ~torch.isnan(sampler)
        if known.any():
            delta = (learner - sampler)[known].double()
            self.tokens += int(known.sum())
            self.abs_sum += float(delta.abs().sum())
            self.kl_sum += float((torch.exp(delta) - 1 - delta).sum())

    def metrics(self) -> dict[str, float]:
        if not self.tokens:
            return {}
        return {"mismatch_abs": self.abs_sum / self.tokens, "mismatch_kl": self.kl_sum / self.tokens}


def _frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` that takes no gradients (the KL penalty's reference)."""
    frozen = copy.deepcopy(model)
    frozen.eval()
    for parameter in frozen.parameters():
        parameter.requires_grad_(False)
    return frozen


def _write_policy(snapshot: dict, path: str) -> None:
    """The files of one saved policy (below). Whatever fails while writing them (torch.save and
    safetensors raise their own errors on a full disk) is an OSError naming the folder, so the run
    ends with one line and resumes from the checkpoint before."""
    try:
        _write_policy_files(snapshot, path)
    except OSError:
        raise
    except Exception as exc:
        raise OSError(f"writing the policy files to {path} failed: {type(exc).__name__}: {exc}") from None


def _write_policy_files(snapshot: dict, path: str) -> None:
    """The files of one saved policy: model.safetensors or adapter.safetensors (+ adapter.json),
    and learner.pt (optimizer, torch RNG, version, KL probe)."""
    # lazy: safetensors and torch, only where weights are read or written
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    if snapshot["adapter"] is not None:
        save_file(snapshot["tensors"], os.path.join(path, "adapter.safetensors"))
        with open(os.path.join(path, "adapter.json"), "w") as handle:
            json.dump(snapshot["adapter"], handle)
    else:
        save_file(snapshot["tensors"], os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    torch.save(snapshot["learner"], os.path.join(path, "learner.pt"))


def truncated_is_weights(logp_old: torch.Tensor, sampler: torch.Tensor, cap: float) -> torch.Tensor:
    """min(pi_old / pi_sampler, cap) per token (Yao et al. 2025), 1 where the sampler's log-prob is
    unknown (greedy candidates, older stores)."""
    known = ~torch.isnan(sampler)
    ratio = torch.exp(logp_old.detach() - torch.where(known, sampler, logp_old.detach()))
    return torch.clamp(ratio, max=cap)


class _TruncatedIS:
    """Mean truncated-IS weight and the share of tokens whose weight hit the cap."""

    def __init__(self) -> None:
        self.tokens, self.weight_sum, self.capped = 0, 0.0, 0

    def add(self, weights: torch.Tensor, sampler: torch.Tensor, mask: torch.Tensor, cap: float) -> None:
        known = mask.bool() & ~torch.isnan(sampler)
        self.tokens += int(known.sum())
        self.weight_sum += float(weights[known].sum())
        self.capped += int((weights[known] >= cap).sum())

    def metrics(self) -> dict[str, float]:
        if not self.tokens:
            return {}
        return {"tis_weight_mean": self.weight_sum / self.tokens, "tis_capped_frac": self.capped / self.tokens}


@dataclass
class Batch:
    """A micro-batch: the prefix all its prompts share ([S] token ids, maybe empty), the distinct
    prompts after it ([P, width], left-padded; the mask [P, S + width] covers the prefix too; position
    ids continue the prefix's),
    `which` prompt row each sample continues ([B]), responses ([B, response width], right-padded) with their loss mask,
    per-token temperature and sampler log-prob (NaN where unknown), and the advantages ([B])."""

    prefix_ids: torch.Tensor
    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    prompt_positions: torch.Tensor
    which: torch.Tensor
    response_ids: torch.Tensor
    mask: torch.Tensor
    advantages: torch.Tensor
    temperature: torch.Tensor
    sampler: torch.Tensor

    def to(self, device: torch.device) -> "Batch":
        if device.type == "cpu":
            return self
        return Batch(**{name: value.to(device) for name, value in vars(self).items()})
