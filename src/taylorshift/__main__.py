"""``python -m taylorshift``: the same as the ``taylorshift`` command."""

from .cli import main

raise SystemExit(main())
