"""``python -m crashoverride``: the same as the ``crashoverride`` command."""

from ._cli import main

raise SystemExit(main())
