"""Causal language models: loading, LoRA adapters, chat formats, sampling, the embedded default
model and the on-disk registry of model versions."""
