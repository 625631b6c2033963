"""The transformers inference engine: all prompts' K candidates in one batched generate call.

Prompts are chat messages, rendered with the model's chat template and left-padded; each prompt
is repeated K times inside `generate` (num_return_sequences), so every candidate of a group is
drawn from the identical token sequence. The response keeps its end-of-turn token (so the policy
learns to stop) and drops the padding after it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from mas_lab.config import Lora, Sampling


@dataclass
class Generation:
    prompt_ids: list[int]
    response_ids: list[int]
    text: str


def set_threads(threads: int) -> None:
    """Ray sets torch threads from an actor's num_cpus; on this machine the phases alternate, so
    each actor may use every core during its phase (0 = all cores)."""
    import os

    torch.set_num_threads(threads or os.cpu_count() or 1)


class HFEngine:
    def __init__(self, model_dir: str, dtype: str = "float32", threads: int = 0, adapters: dict[str, Lora] | None = None):
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging

        logging.disable_progress_bar()
        logging.set_verbosity_error()
        set_threads(threads)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
        self.adapters = adapters or {}
        if self.adapters:
            from mas_lab import lora

            self.model = lora.attach(self.model, self.adapters)
        self.model.eval()
        self.eos_ids = {self.tokenizer.eos_token_id}
        self.stats = {"generated_tokens": 0, "generate_s": 0.0}

    def encode(self, messages: list[dict[str, str]]) -> list[int]:
        out = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
        return list(out["input_ids"])

    @torch.no_grad()
    def generate(self, policy: str, prompts: list[list[dict[str, str]]], n: int, sampling: Sampling,
                 seed: int) -> list[list[Generation]]:
        """For each prompt, n candidates. Seeded per call, so a step's samples are reproducible.
        With per-role adapters, `policy` names the adapter to generate with."""
        started = time.perf_counter()
        if self.adapters:
            from mas_lab import lora

            lora.use(self.model, policy)
        encoded = [self.encode(messages) for messages in prompts]
        width = max(len(ids) for ids in encoded)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in encoded])
        attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in encoded])
        torch.manual_seed(seed)
        greedy = sampling.temperature == 0.0
        output = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            do_sample=not greedy,
            temperature=None if greedy else sampling.temperature,
            top_p=None if greedy else sampling.top_p,
            top_k=None,
            max_new_tokens=sampling.max_new_tokens,
            num_return_sequences=n,
            pad_token_id=pad,
            eos_token_id=list(self.eos_ids),
        )
        results: list[list[Generation]] = []
        for p, ids in enumerate(encoded):
            row = []
            for c in range(n):
                response = output[p * n + c, width:].tolist()
                response = self._cut(response)
                text = self.tokenizer.decode(response, skip_special_tokens=True)
                row.append(Generation(prompt_ids=ids, response_ids=response, text=text))
            results.append(row)
        self.stats["generated_tokens"] += sum(len(g.response_ids) for row in results for g in row)
        self.stats["generate_s"] += time.perf_counter() - started
        return results

    def _cut(self, response: list[int]) -> list[int]:
        for i, token in enumerate(response):
            if token in self.eos_ids:
                return response[: i + 1]
        return response

    def load_weights(self, state: dict[str, torch.Tensor], policy: str | None = None) -> None:
        if self.adapters:
            from mas_lab import lora

            lora.load_adapter_state(self.model, policy, state)
        else:
            self.model.load_state_dict(state)
