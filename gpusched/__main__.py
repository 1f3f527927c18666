"""``python -m gpusched``."""

from gpusched.cli import main

raise SystemExit(main())
