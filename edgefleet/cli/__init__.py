"""The `edgefleet` command line: one module (or room: control/, convert/, setup/) per command group, registered in
main.py."""
