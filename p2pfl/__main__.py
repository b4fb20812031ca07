from p2pfl.cli import main

raise SystemExit(main())
