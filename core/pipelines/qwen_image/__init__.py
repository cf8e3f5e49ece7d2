"""Qwen-Image (and its Edit models): the pipeline and the engine's entry."""
