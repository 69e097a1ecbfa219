"""``python -m flashinfer_sm120`` is the ``flashinfer-sm120`` command."""

from .cli import main

raise SystemExit(main())
