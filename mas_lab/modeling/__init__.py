"""The models: named models and their builds, LoRA adapters, precision, the shared-prefix forward."""
