"""mas-lab: train teams of LLM agents with AT-GRPO (arXiv 2510.11062). The headless core.

The notebook API: `mas_lab.load_run(path)`, `mas_lab.load_study(path)` and
`mas_lab.paired_runs(runs_a, runs_b)` (mas_lab/notebook.py), imported on first use so that
`import mas_lab` stays light."""

__version__ = "0.1.0"
__all__ = ["load_run", "load_study", "paired_runs"]


def __getattr__(name: str):
    if name in __all__:
        # lazy: the notebook API (config, pydantic, yaml) on first use, not with every import of the package
        from mas_lab import notebook

        return getattr(notebook, name)
    raise AttributeError(f"module 'mas_lab' has no attribute '{name}'")
