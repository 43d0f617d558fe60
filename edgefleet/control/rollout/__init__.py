"""Rollouts in waves: the plan (a pure function), the engine that drives them, how they end, the shadow phase."""
