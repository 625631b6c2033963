"""What a run keeps: its SQLite store, checkpoints, the control API, MLflow tracking, provenance and its folder."""
