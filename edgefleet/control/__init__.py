"""The host control plane: publishing bundles, desired state, fleet status, the demo."""
