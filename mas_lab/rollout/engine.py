"""The transformers inference engine: all prompts' K candidates in one batched generate call.

Prompts are chat messages, rendered with the model's chat template and left-padded; each prompt
is repeated K times inside `generate` (num_return_sequences), so every candidate of a group is
drawn from the identical token sequence. The response keeps its end-of-turn token (so the policy
learns to stop) and drops the padding after it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from mas_lab.config import Lora, Sampling


@dataclass
class Generation:
    """One candidate: its tokens, its text, and the sampler's log-probability of each response
    token under the distribution it was sampled from (logits / temperature; empty when greedy)."""

    prompt_ids: list[int]
    response_ids: list[int]
    text: str
    logprobs: list[float] = field(default_factory=list)
    entropy: float | None = None  # mean entropy of the sampled distribution over its tokens
    truncated: bool = False  # cut at max_new_tokens before any stop token


def set_threads(threads: int) -> None:
    """Ray sets torch threads from an actor's num_cpus; on this machine the phases alternate, so
    each actor may use every core during its phase (0 = all cores)."""
    import os

    torch.set_num_threads(threads or os.cpu_count() or 1)


def stop_ids(tokenizer, model) -> set[int]:
    """Every token that ends a turn: the tokenizer's eos, the model's generation config eos (one or
    a list), and the ChatML / SmolLM2 end tokens where the vocabulary has them (SmolLM2's eos is
    <|im_end|>, but <|endoftext|> also ends its text)."""
    ids = {tokenizer.eos_token_id}
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(configured if isinstance(configured, (list, tuple)) else [configured])
    vocab = tokenizer.get_vocab()
    ids.update(vocab[token] for token in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>") if token in vocab)
    return {i for i in ids if i is not None}


def sampled_logprobs(logits: tuple[torch.Tensor, ...], tokens: torch.Tensor,
                     temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """[rows, steps] log-probabilities of the sampled tokens under softmax(logits / temperature)
    (the distribution the learner differentiates; top-p truncation is not renormalised in, as in
    TRL and verl), and the entropy of that distribution at each step. `logits` are generate's raw
    per-step logits."""
    logprobs = torch.empty(tokens.shape, dtype=torch.float32)
    entropy = torch.empty(tokens.shape, dtype=torch.float32)
    for step, step_logits in enumerate(logits):
        log_p = torch.log_softmax(step_logits.float() / temperature, dim=-1)
        logprobs[:, step] = log_p.gather(-1, tokens[:, step : step + 1]).squeeze(-1)
        entropy[:, step] = -(log_p.exp() * log_p).sum(-1)
    return logprobs, entropy


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
        self.eos_ids = stop_ids(self.tokenizer, self.model)
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
            eos_token_id=sorted(self.eos_ids),
            return_dict_in_generate=True,
            output_logits=not greedy,
        )
        sequences = output.sequences
        logprobs, entropy = (None, None) if greedy else sampled_logprobs(output.logits, sequences[:, width:],
                                                                          sampling.temperature)
        results: list[list[Generation]] = []
        for p, ids in enumerate(encoded):
            row = []
            for c in range(n):
                response = self._cut(sequences[p * n + c, width:].tolist())
                text = self.tokenizer.decode(response, skip_special_tokens=True)
                lp = logprobs[p * n + c, : len(response)].tolist() if logprobs is not None else []
                h = float(entropy[p * n + c, : len(response)].mean()) if entropy is not None and response else None
                truncated = len(response) >= sampling.max_new_tokens and response[-1] not in self.eos_ids
                row.append(Generation(prompt_ids=ids, response_ids=response, text=text, logprobs=lp, entropy=h,
                                      truncated=truncated))
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
