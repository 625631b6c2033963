"""A key/value cache for the sampling loop that appends in place.

transformers' DynamicCache appends each new token's keys and values with torch.cat, which copies
the whole cache of every layer at every generated token. For short answers after long
observations (AT-GRPO's shape: ~235 prompt tokens, up to 64 new ones, 32 rows) that copying was
the largest cost of a decoding step on the CPU: 37% of the sampling time, more than the attention
(docs/measurements.md, "The sampling loop's key/value cache"). `ReservedCache` keeps each layer's
keys and values in a buffer with room for the tokens still to come and writes into it; the model
sees a view of the filled part. Used under no_grad only (in-place writes into tensors that a
backward pass still needs would be wrong): the learner's three forward calls keep DynamicCache.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer


class ReservedLayer(DynamicLayer):
    """One layer's keys and values ([batch, heads, length, head dim]) inside buffers of
    `capacity` positions, grown (doubled) only if a call brings more."""

    def __init__(self, capacity: int = 0):
        super().__init__()
        self.capacity = capacity
        self.length = 0
        self._keys: torch.Tensor | None = None
        self._values: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.is_initialized = True

    def _reserve(self, key_states: torch.Tensor, value_states: torch.Tensor, needed: int) -> None:
        if self._keys is not None and needed <= self._keys.shape[-2]:
            return
        room = max(needed, self.capacity, 2 * (self._keys.shape[-2] if self._keys is not None else 0))
        batch, heads, _, width = key_states.shape
        keys = key_states.new_empty(batch, heads, room, width)
        values = value_states.new_empty(batch, heads, room, value_states.shape[-1])
        if self.length:
            assert self._keys is not None and self._values is not None  # a non-empty cache has its tensors
            keys[:, :, : self.length].copy_(self._keys[:, :, : self.length])
            values[:, :, : self.length].copy_(self._values[:, :, : self.length])
        self._keys, self._values = keys, values

    def _views(self) -> None:
        assert self._keys is not None and self._values is not None
        self.keys = self._keys[:, :, : self.length]
        self.values = self._values[:, :, : self.length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        new = key_states.shape[-2]
        self._reserve(key_states, value_states, self.length + new)
        assert self._keys is not None and self._values is not None  # reserved just above
        self._keys[:, :, self.length : self.length + new].copy_(key_states)
        self._values[:, :, self.length : self.length + new].copy_(value_states)
        self.length += new
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.length:
            assert self._keys is not None and self._values is not None
            self._keys, self._values = self._keys[indices], self._values[indices]
            self._views()

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.length:
            assert self._keys is not None and self._values is not None
            self._keys = self._keys.repeat_interleave(repeats, dim=0)
            self._values = self._values.repeat_interleave(repeats, dim=0)
            self._views()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative number of tokens to remove")
        if tokens_to_remove and self.length:
            self.length = max(self.length + tokens_to_remove, 0)
            self._views()

    def reset(self) -> None:
        self.length = 0
        self._keys = self._values = None
        super().reset()


class ReservedCache(Cache):
    """A cache of ReservedLayer, each with room for `capacity` positions (prompt width plus the
    most new tokens of the call)."""

    def __init__(self, capacity: int):
        # transformers calls the factory with no arguments to make each layer (typed as a class there)
        super().__init__(layer_class_to_replicate=lambda: ReservedLayer(capacity))  # type: ignore[arg-type]
