"""``flashinfer-sm120 cache export`` / ``cache import``: move a warmed FlashInfer JIT cache
between machines (e.g. from a Docker build stage with nvcc to a runtime image without);
``cache prune``: list and remove what is no longer used."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from ..formats import cli_float, cli_size
from .common import err as _err

__all__ = ["add_parsers", "run_export", "run_import", "run_prune"]


def run_export(args: argparse.Namespace) -> int:
    from ..warmup import cachepack, replay, session

    import os

    if os.path.lexists(args.out) and not (os.path.isdir(args.out) and not os.listdir(args.out)):
        return _err(f"{args.out} already exists; choose a new path (an export never overwrites)")
    try:
        entries, problems = replay.load(args.manifest)
        session.apply_server_cache(None, entries)  # the JIT dir the recording server used (SGLang's)
        sess = session.prepare(replay.arch_for(entries, args.arch))
        regenerable = [e for e in entries if e.get("regenerable") and e.get("flashinfer") == sess.flashinfer]
        for e in entries:
            if e not in regenerable:
                print(f"not exported {e.get('name')}: {e.get('why') or 'recorded with FlashInfer ' + str(e.get('flashinfer'))}",
                      file=sys.stderr)
        names = cachepack.export(regenerable, sess, args.out)
    except session.BuildError as exc:
        return _err(str(exc))
    print(f"exported {len(names)} module(s) for {' '.join(sess.targets)} (FlashInfer {sess.flashinfer}, "
          f"CUDA {sess.cuda_version} at {sess.cuda_home}) to {args.out}")
    for n in names:
        print(f"  {n}")
    return 0


def run_import(args: argparse.Namespace) -> int:
    from ..warmup import cachemeta, cachepack, session

    limits = cachemeta.Limits(max_total=args.max_bytes) if args.max_bytes else cachemeta.Limits()
    try:
        meta = cachemeta.check_members(args.src, limits)  # before anything is imported or unpacked
        arch = args.arch
        if arch is None:
            arch = _archive_targets(meta)
        session.apply_server_cache()  # install where the server installed here will look (SGLang's dir)
        sess = session.prepare(arch)
        report = cachepack.install(args.src, sess, force=args.force, limits=limits)
    except session.BuildError as exc:
        return _err(str(exc))
    if args.json:
        print(json.dumps({"fingerprint": sess.fingerprint(), "modules": report}, indent=2))
    else:
        for r in report:
            why = f" ({r['why']})" if r.get("why") else ""
            rep = f" (replaced {', '.join(r['replaced'])})" if r.get("replaced") else ""
            print(f"{r['status']} {r['module']}{why}{rep}")
    return 1 if any(r["status"] in ("stale", "kept existing", "refused") for r in report) else 0


def _archive_targets(meta) -> str | None:
    """The archive's targets when no GPU is visible (a GPU-less build stage), else None
    (FlashInfer's targets then come from the GPUs, and the import checks they match)."""
    try:
        from .. import gpus

        if gpus.visible_gpus():
            return None
    except Exception:  # no NVML, no driver: treat as no GPU
        pass
    targets = meta.fingerprint["targets"]  # checked by cachepack.parse_meta: major.minor[a|f] each
    if targets:
        print(f"flashinfer-sm120: no GPU visible; using the archive's targets {' '.join(targets)}",
              file=sys.stderr)
        return " ".join(targets)
    return None


def run_prune(args: argparse.Namespace) -> int:
    from .. import prune

    report = prune.scan(args.older_than)
    if args.yes:
        prune.remove(report)
    entries = report["entries"]
    if args.json:
        out = dict(report, entries=[dataclasses.asdict(e) for e in entries])
        print(json.dumps(out, indent=2))
    else:
        _print_prune(report, args.yes)
    return 1 if any(e.error for e in entries) else 0


def _print_prune(report: dict, yes: bool) -> None:
    from ..prune import human

    for r in report["roots"]:
        if r["path"]:
            print(f"{r['what']} cache: {r['path']} ({human(r['bytes'])})")
    for e in report["entries"]:
        if e.removed:
            word = "removed"
        elif e.error:
            word = "FAILED"
        elif e.reason and not e.kept:
            word = "remove" if not yes else "left"
        else:
            word = "keep"
        why = e.error or (f"{e.reason}; kept: {e.kept}" if e.reason and e.kept else e.kept or e.reason
                          or "still usable: its toolkit (and FlashInfer release) are installed")
        print(f"  {word:<7} {human(e.bytes):>10}  {e.kind:<4} {e.path}\n          {why}")
    if not report["entries"]:
        print("  nothing cached")
    stale = [e for e in report["entries"] if e.reason and not e.kept and not e.removed]
    freed = sum(e.bytes for e in report["entries"] if e.removed)
    if yes:
        print(f"freed {human(freed)}")
    elif stale:
        print(f"would free {human(sum(e.bytes for e in stale))} ({len(stale)} entries): run with --yes to remove them")
    else:
        print("nothing to remove")


def add_parsers(sub) -> None:
    """Register ``cache`` with its subcommands ``export``, ``import`` and ``prune``."""
    c = sub.add_parser("cache", help="move a warmed JIT cache between machines; prune old entries",
                       description="export/import a warmed FlashInfer JIT cache; prune what is no longer used")
    cs = c.add_subparsers(dest="cache_cmd", required=True, metavar="{export,import,prune}")
    e = cs.add_parser("export", help="write the JIT cache entries of a manifest to a directory or archive")
    e.add_argument("--from", dest="manifest", required=True, metavar="MANIFEST",
                   help="manifest recorded with FLASHINFER_SM120_RECORD (built here with build --from)")
    e.add_argument("out", help="new directory, or an archive path ending .tar, .tar.gz or .tgz")
    e.add_argument("--arch", help="targets, as for build (default: the manifest's)")
    e.set_defaults(func=run_export)
    i = cs.add_parser("import", help="install an exported JIT cache into FlashInfer's JIT cache here")
    i.add_argument("src", help="directory or archive written by 'cache export'")
    i.add_argument("--arch", help="targets (default: the GPUs present)")
    i.add_argument("--force", action="store_true", help="replace existing entries that differ")
    i.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    i.add_argument("--max-bytes", type=cli_size("--max-bytes", 1 << 20), metavar="SIZE",
                   help="refuse an export whose files add up to more than SIZE (e.g. 8G; default 32G)")
    i.set_defaults(func=run_import)
    pr = cs.add_parser("prune", help="list (and with --yes remove) views and JIT directories no longer used")
    pr.add_argument("--yes", action="store_true", help="remove what is listed as 'remove' (default: list only)")
    pr.add_argument("--older-than", type=cli_float("--older-than", 0.0, 36500.0), metavar="DAYS",
                    help="also remove views and JIT directories not used for DAYS days")
    pr.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    pr.set_defaults(func=run_prune)
