"""The host's keys and certificates: the root and role keys, the broker's small CA, the CRL."""
