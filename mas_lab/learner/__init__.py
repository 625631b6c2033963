"""The Learner: one per policy; updates the model with the clipped AT-GRPO loss."""

from mas_lab.learner.learner import Learner

__all__ = ["Learner"]
