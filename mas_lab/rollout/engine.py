"""The transformers inference engine: all prompts' K candidates in one batched sampling loop.

Prompts are chat messages, rendered with the model's chat template; the loop (rollout/decode.py)
prefills each prompt once and shares its KV cache across its K candidates, so every candidate of
a group is drawn from the identical token sequence. The response keeps its end-of-turn token (so
the policy learns to stop).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from mas_lab.actors.placement import set_threads
from mas_lab.config import Lora, Sampling
from mas_lab.modeling import lora, precision
from mas_lab.modeling.flops import FlopMeter, peak_for
from mas_lab.rollout import decode


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
    version: int = 0  # the weight version of the policy that generated it (set by the rollout worker)
    # its share of its call's FLOPs (modeling/flops.py; None where the engine does not count them,
    # vLLM) and the engine's measured matmul peak in GFLOP/s (None where not measured on this machine)
    flops: float | None = None
    peak_gflops: float | None = None


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


def encode_chat(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """A prompt's token ids: the messages in the model's chat template, ready for the reply
    (every engine, so both engines sample from the same tokens)."""
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    return list(out["input_ids"])


class HFEngine:
    def __init__(
        self,
        model_dir: str,
        dtype: str = "float32",
        threads: int = 0,
        adapters: dict[str, Lora] | None = None,
        device: str = "cpu",
    ):
        # lazy: transformers (and torch), only when a model or tokenizer is built
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging

        logging.disable_progress_bar()
        logging.set_verbosity_error()
        set_threads(threads)
        self.precision = precision.report(dtype, device)
        dtype = str(self.precision["dtype"])
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
        self.model = model.to(device)  # type: ignore[arg-type]  # transformers types .to() for models only
        self.adapters = adapters or {}
        self.merged = None  # per-role adapters merged into per-policy weights (lora.MergedAdapters)
        if self.adapters:
            if any(spec.modules_to_save for spec in self.adapters.values()):
                self.model = lora.attach(self.model, self.adapters)  # fully trained modules: peft's model
            else:
                self.merged = lora.MergedAdapters(self.model, self.adapters)
        self.model.eval()
        self.meter = FlopMeter(self.model)
        self.peak = peak_for(self.meter.dims, dtype, device)
        self.eos_ids = stop_ids(self.tokenizer, self.model)
        self.stats = {"generated_tokens": 0, "generate_s": 0.0}

    def encode(self, messages: list[dict[str, str]]) -> list[int]:
        return encode_chat(self.tokenizer, messages)

    @torch.no_grad()
    def generate(
        self,
        policy: str,
        prompts: list[list[dict[str, str]]],
        n: int,
        sampling: Sampling,
        seed: int,
        first_index: int = 0,
    ) -> list[list[Generation]]:
        """For each prompt, n candidates (rollout/decode.py: one prefill per prompt, finished rows
        leave the batch). Seeded per call and per candidate, so a step's samples are reproducible
        and do not depend on the other prompts of the call; `first_index` is the position of
        prompts[0] in the whole list when a worker got a slice. With per-role adapters, `policy`
        names the adapter to generate with."""
        started = time.perf_counter()
        if self.merged:
            self.merged.use(policy)
        elif self.adapters:
            lora.use(self.model, policy)
        encoded = [self.encode(messages) for messages in prompts]
        self.meter.take()
        decoded = decode.sample(
            self.model,
            encoded,
            n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_new_tokens=sampling.max_new_tokens,
            stop_ids=self.eos_ids,
            pad_id=self.tokenizer.pad_token_id,
            seed=seed,
            first_index=first_index,
        )
        share = self.meter.take() / max(1, sum(len(row) for row in decoded))
        results = [
            [
                Generation(
                    prompt_ids=ids,
                    response_ids=d.tokens,
                    text=str(self.tokenizer.decode(d.tokens, skip_special_tokens=True)),
                    logprobs=d.logprobs,
                    entropy=sum(d.entropy) / len(d.entropy) if d.entropy else None,
                    truncated=d.truncated,
                    flops=share,
                    peak_gflops=self.peak,
                )
                for d in row
            ]
            for ids, row in zip(encoded, decoded)
        ]
        self.stats["generated_tokens"] += sum(len(g.response_ids) for row in results for g in row)
        self.stats["generate_s"] += time.perf_counter() - started
        return results

    def load_weights(self, state: dict[str, torch.Tensor], policy: str | None = None) -> None:
        if not self.adapters:
            self.model.load_state_dict(state)
            return
        if policy is None:
            raise ValueError("an engine serving LoRA adapters loads one policy's adapter at a time: name the policy")
        if self.merged:
            self.merged.load(policy, state)
        else:
            lora.load_adapter_state(self.model, policy, state)
