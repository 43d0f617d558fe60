"""`edgefleet convert`: the command (`command`), its conversion-farm options (`farm`) and its progress bars on
stderr (`progress`)."""
