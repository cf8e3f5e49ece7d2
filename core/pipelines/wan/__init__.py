"""Wan 2.x video (text to video with one DiT or the A14B expert pair)."""
