"""sigma schedules, samplers, previews."""
