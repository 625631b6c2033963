"""The actors behind a run: a rollout worker and a learner per base model (Ray or in-process) and where they run."""
