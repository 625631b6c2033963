"""Learner: holds one policy's trainable model and optimizer; a plain class Ray wraps as an actor.

`update` applies the token-level clipped objective (paper Eq. 5, algo/loss.py) to the samples of
the roles this policy serves (routing by sigma happens in the controller). With one epoch and the
whole batch as one mini-batch, logp_old is logp.detach() of the same forward pass (AT_GRPO.md);
with more epochs, logp_old is computed once before the first update.
"""
from __future__ import annotations

import math
import os
import time

import torch

from mas_lab.algo.loss import clipped_policy_loss
from mas_lab.rollout.engine import set_threads


class Learner:
    def __init__(self, model_dir: str, algorithm: dict, dtype: str = "float32", threads: int = 0, seed: int = 0):
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging

        logging.disable_progress_bar()
        logging.set_verbosity_error()
        set_threads(threads)
        torch.manual_seed(seed)
        self.algo = algorithm
        # master weights stay float32; dtype bfloat16 means bf16 autocast for the forward/backward
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.autocast = dtype == "bfloat16"
        self.model.config.use_cache = False
        self.model.train()
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=algorithm["lr"],
            weight_decay=algorithm["weight_decay"],
        )
        self.version = 0

    def _batch(self, samples: list[dict]) -> tuple[torch.Tensor, ...]:
        """Right-padded [prompt + response] ids, attention mask, response-token mask, advantages."""
        sequences = [s["prompt_ids"] + s["response_ids"] for s in samples]
        width = max(len(seq) for seq in sequences)
        ids = torch.zeros(len(samples), width, dtype=torch.long)
        attention = torch.zeros(len(samples), width, dtype=torch.long)
        loss_mask = torch.zeros(len(samples), width - 1)
        for row, (s, seq) in enumerate(zip(samples, sequences)):
            ids[row, : len(seq)] = torch.tensor(seq)
            attention[row, : len(seq)] = 1
            # token j+1 is predicted at position j; only response tokens carry loss
            loss_mask[row, len(s["prompt_ids"]) - 1 : len(seq) - 1] = 1.0
        advantages = torch.tensor([s["advantage"] for s in samples], dtype=torch.float32)
        return ids, attention, loss_mask, advantages

    def _logp(self, ids: torch.Tensor, attention: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Log-probabilities of the response tokens ([B, L-1], zero elsewhere). The output layer
        runs only at response positions: prompt positions carry no loss, and with a large vocabulary
        the output layer is a good part of the cost."""
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
            hidden = self.model.get_decoder()(input_ids=ids, attention_mask=attention).last_hidden_state[:, :-1]
            where = mask.bool()
            logits = self.model.get_output_embeddings()(hidden[where]).float()
        picked = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:][where].unsqueeze(-1)).squeeze(-1)
        return torch.zeros(mask.shape, dtype=picked.dtype).masked_scatter(where, picked)

    def update(self, samples: list[dict]) -> dict[str, float]:
        """One policy update on this step's samples; returns loss, clip fraction, grad norm."""
        started = time.perf_counter()
        if not samples:
            return {"loss": 0.0, "clip_frac": 0.0, "grad_norm": 0.0, "samples": 0, "tokens": 0, "learner_s": 0.0}
        algo = self.algo
        size = algo["micro_batch"]
        micro = [self._batch(samples[i : i + size]) for i in range(0, len(samples), size)]
        tokens = sum(float(m[2].sum()) for m in micro)
        normalizer = tokens if algo["loss_agg"] == "token_mean" else float(len(samples))
        old = None
        if algo["epochs"] > 1:
            with torch.no_grad():
                old = [self._logp(ids, att, mask) for ids, att, mask, _ in micro]
        total_loss, clipped, grad_norm = 0.0, 0.0, 0.0
        for _ in range(algo["epochs"]):
            self.optimizer.zero_grad(set_to_none=True)
            epoch_loss = 0.0
            for i, (ids, attention, mask, advantages) in enumerate(micro):
                logp = self._logp(ids, attention, mask)
                logp_old = old[i] if old is not None else logp.detach()
                loss, stats = clipped_policy_loss(
                    logp, logp_old, advantages, mask, algo["clip_eps_low"], algo["clip_eps_high"],
                    algo["dual_clip"], algo["loss_agg"], normalizer,
                )
                loss.backward()
                epoch_loss += float(loss.detach())
                clipped += stats["clipped_tokens"]
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), algo["grad_clip"]))
            if math.isfinite(grad_norm):
                self.optimizer.step()
            total_loss = epoch_loss
        self.version += 1
        return {
            "loss": total_loss,
            "clip_frac": clipped / max(tokens * algo["epochs"], 1.0),
            "grad_norm": grad_norm,
            "samples": len(samples),
            "tokens": tokens,
            "learner_s": time.perf_counter() - started,
        }

    def weights(self) -> dict[str, torch.Tensor]:
        """The state dict for the rollout engine (weight sync), in the engine's dtype: with
        bfloat16 this halves what crosses the object store."""
        dtype = torch.bfloat16 if self.autocast else None
        return {k: v.detach().to(dtype) if dtype else v.detach() for k, v in self.model.state_dict().items()}

    def save(self, path: str) -> None:
        """Weights (safetensors), optimizer state, torch RNG state and version, for exact resume."""
        from safetensors.torch import save_model

        os.makedirs(path, exist_ok=True)
        save_model(self.model, os.path.join(path, "model.safetensors"))
        torch.save(
            {"optimizer": self.optimizer.state_dict(), "torch_rng": torch.get_rng_state(), "version": self.version},
            os.path.join(path, "learner.pt"),
        )

    def load(self, path: str) -> int:
        from safetensors.torch import load_model

        load_model(self.model, os.path.join(path, "model.safetensors"))
        state = torch.load(os.path.join(path, "learner.pt"), weights_only=True)
        self.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["torch_rng"])
        self.version = state["version"]
        return self.version

    def ready(self) -> bool:
        return True
