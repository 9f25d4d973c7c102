"""``python -m crashoverride``: the same as the ``crashoverride`` command."""

from crashoverride._cli.main import main

raise SystemExit(main())
