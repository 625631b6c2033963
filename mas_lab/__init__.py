"""mas-lab: train teams of LLM agents with AT-GRPO (arXiv 2510.11062). The headless core."""

__version__ = "0.1.0"
