"""The control-plane commands: serve, devices, groups, desired state, rollouts, tokens, audit."""
