"""Training: Algorithm 1 (the trainer), the tree rollout, the no-model baselines, the held-out evaluation and what a step records."""
