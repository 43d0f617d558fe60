"""Judging a wave: pure functions over what devices reported and what the host knows."""
