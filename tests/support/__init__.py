"""Test and benchmark support: brokers, servers, agent processes, simulated devices, models."""
