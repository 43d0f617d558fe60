"""The `edgefleet` command line: one module per command group, registered in main.py."""
