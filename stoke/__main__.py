from stoke.cli import main

raise SystemExit(main())
