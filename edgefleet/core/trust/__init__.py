"""Signing keys and the root-signed key set that delegates the bundle and ops roles."""
