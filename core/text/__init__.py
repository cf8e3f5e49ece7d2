"""tokenizers and prompt syntax."""
