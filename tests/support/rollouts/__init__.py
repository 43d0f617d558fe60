"""Rollout fixtures: a control plane with simulated or real devices, traffic, a lying device."""
