"""Broker rights: Mosquitto's dynamic security, static ACLs, and rights that follow the signed desired documents."""
