"""Data files shipped with sdplan (vocabularies, built-in profiles, demo weights)."""
