"""``flashinfer-sm120 enable|disable``: the ``.pth`` autoload."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .common import err as _err

__all__ = ["add_parsers"]

_PTH_NAME = "flashinfer_sm120_autoload.pth"
# site.py executes .pth lines that start with "import"; one line, and it must
# never stop the interpreter from starting, hence the try/except inside exec.
_PTH_LINE = (
    "import os, sys; exec(\"if os.environ.get('FLASHINFER_SM120_DISABLE', '').strip().lower()"
    " in ('', '0', 'false', 'no', 'off'):\\n"
    " try:\\n  import flashinfer_sm120\\n except Exception as e:\\n"
    "  sys.stderr.write('flashinfer-sm120: autoload failed: %r\\\\n' % (e,))\")\n"
)


def _site_target(user: bool, site_dir: str | None = None) -> Path:
    import site
    import sysconfig

    if site_dir:
        return Path(site_dir)
    return Path(site.getusersitepackages() if user else sysconfig.get_paths()["purelib"])


def _enable(args: argparse.Namespace) -> int:
    target = _site_target(args.user, args.site_dir) / _PTH_NAME
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(_PTH_LINE)
    except OSError as exc:
        return _err(f"cannot write {target}: {exc.strerror}; try --user or a virtualenv")
    print(f"wrote {target}: every Python process of {sys.executable} now imports flashinfer_sm120 "
          f"at start-up (set FLASHINFER_SM120_DISABLE=1 to skip it)")
    return 0


def _disable(args: argparse.Namespace) -> int:
    removed = []
    for user in ((False,) if args.site_dir else (False, True)):
        target = _site_target(user, args.site_dir) / _PTH_NAME
        if target.exists():
            target.unlink()
            removed.append(str(target))
    print("removed " + ", ".join(removed) if removed else "nothing to remove")
    return 0



def add_parsers(sub) -> None:
    """Register the ``enable`` and ``disable`` subcommands."""
    e = sub.add_parser("enable", help="import flashinfer_sm120 in every process (writes a .pth file)")
    e.add_argument("--user", action="store_true", help="user site-packages instead of this environment")
    e.add_argument("--site-dir", help=argparse.SUPPRESS)
    e.set_defaults(func=_enable)
    dis = sub.add_parser("disable", help="remove the .pth file written by 'enable'")
    dis.add_argument("--site-dir", help=argparse.SUPPRESS)
    dis.set_defaults(func=_disable)
