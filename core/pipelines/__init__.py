"""one pipeline per model family."""
