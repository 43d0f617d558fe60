"""Simulated agents: real MQTT clients speaking the agent's protocol, for tests and benchmarks."""
