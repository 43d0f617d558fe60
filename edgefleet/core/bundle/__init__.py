"""The bundle: its manifest, the signed file, and the golden set a device re-runs."""
