"""The launcher: the small process systemd runs, which starts the agent and switches it to a new release.

Standard library only (and edgefleet.core.launcher_files / durable, themselves standard library only), and
installed once with the device's first agent: releases go into environments of their own under the state directory
and never replace it, so no release can break it. `state.py` is its state machine, `process.py` runs it.
"""
