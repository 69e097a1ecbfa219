"""``python -m flashinfer_sm120`` is the ``flashinfer-sm120`` command."""

from flashinfer_sm120.cli import main

raise SystemExit(main())
