"""What the host and the device both need: bundle format, signing, profiles, topics and messages.

Nothing in here imports the agent, the converter or the control plane.
"""
