"""The fleet: the device registry, ingestion of what devices report, status views and remote inference."""
