"""Boolean environment variables, read one way everywhere (the ``.pth`` hook keeps its own copy, which
tests/integration/test_autoload.py checks agrees)."""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["FALSE_VALUES", "env_flag"]

#: Values of a boolean environment variable that mean "off" (case-insensitive, stripped).
FALSE_VALUES = ("", "0", "false", "no", "off")


def env_flag(name: str, env: Mapping[str, str] | None = None) -> bool:
    """Whether boolean variable ``name`` is on in ``env`` (default ``os.environ``)."""
    env = os.environ if env is None else env
    return env.get(name, "").strip().lower() not in FALSE_VALUES
