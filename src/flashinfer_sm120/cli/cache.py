"""``flashinfer-sm120 cache prune``: list and remove what is no longer used."""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal

from flashinfer_sm120.safety.formats.base import plural
from flashinfer_sm120.safety.formats.params import cli_float
from flashinfer_sm120.cli.common import err as _err


def run_prune(args: argparse.Namespace) -> int:
    from flashinfer_sm120.diagnose import prune

    report = prune.scan(args.older_than)
    stopped = 0
    if args.yes:
        try:
            prune.remove(report)
        except (KeyboardInterrupt, SystemExit) as exc:  # threat-model: P8 -- what went and what is left, told
            stopped = 130 if isinstance(exc, KeyboardInterrupt) else exc.code if isinstance(exc.code, int) else 1
            report["interrupted"] = signal.Signals(stopped - 128).name if 128 < stopped < 128 + 65 else "stopped"
    entries = report["entries"]
    if args.json:
        out = dict(report, entries=[dataclasses.asdict(e) for e in entries])
        print(json.dumps(out, indent=2))
    else:
        _print_prune(report, args.yes)
    if stopped:
        left = [e for e in entries if e.reason and not e.kept and not e.removed]
        _err(f"interrupted by {report['interrupted']}: {plural(sum(e.removed for e in entries), 'entry')} removed, "
             f"{len(left)} left; Fix: run 'flashinfer-sm120 cache prune --yes' again to remove the rest")
    return stopped or (1 if any(e.error for e in entries) else 0)


def _print_prune(report: dict, yes: bool) -> None:
    from flashinfer_sm120.safety.formats.base import printable
    from flashinfer_sm120.core.jitenv.memory import fmt_bytes

    # threat-model: P8 -- paths are names found on disk (in a shared workspace base others name
    # directories) and reasons quote them: a terminal shows them, never acts on them
    for r in report["roots"]:
        if r["path"]:
            print(printable(f"{r['what']} cache: {r['path']} ({fmt_bytes(r['bytes'])})"))
    for e in report["entries"]:
        word = ("removed" if e.removed else "FAILED" if e.error else ("left" if yes else "remove")
                if e.reason and not e.kept else "keep")
        why = e.error or (f"{e.reason}; kept: {e.kept}" if e.reason and e.kept else e.kept or e.reason)
        print(printable(f"  {word:<7} {fmt_bytes(e.bytes):>10}  {e.kind:<4} {e.path}\n          {why}"))
    if not report["entries"]:
        print("  nothing cached")
    stale = [e for e in report["entries"] if e.reason and not e.kept and not e.removed]
    freed = sum(e.bytes for e in report["entries"] if e.removed)
    if yes:
        print(f"freed {fmt_bytes(freed)}")
    elif stale:
        print(f"would free {fmt_bytes(sum(e.bytes for e in stale))} ({plural(len(stale), 'entry')}): run with --yes to remove them")
    else:
        print("nothing to remove")


def add_parsers(sub) -> None:
    """Register ``cache`` with its subcommand ``prune``."""
    c = sub.add_parser("cache", help="prune old JIT cache entries",
                       description="prune what is no longer used")
    cs = c.add_subparsers(dest="cache_cmd", required=True, metavar="{prune}")
    pr = cs.add_parser("prune", help="list (and with --yes remove) views and JIT directories no longer used")
    pr.add_argument("--yes", action="store_true", help="remove what is listed as 'remove' (default: list only)")
    pr.add_argument("--older-than", type=cli_float("--older-than", 0.0, 36500.0), metavar="DAYS",
                    help="also remove views and JIT directories not used for DAYS days")
    pr.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    pr.set_defaults(func=run_prune)
