"""model files -> tensors, modules, families."""
