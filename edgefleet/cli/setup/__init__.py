"""The operator's first day: `edgefleet init` (`init_command`: a whole secure deployment in one directory, and a
context that points at it) and `edgefleet context` (`context_command`: the named contexts of the host commands,
kept in the file that cli/context.py reads and writes)."""
