"""the engine's Python side."""
