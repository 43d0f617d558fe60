from edgefleet.cli.main import main

raise SystemExit(main())
