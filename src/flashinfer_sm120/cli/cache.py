"""``flashinfer-sm120 cache export`` / ``cache import``: move a warmed FlashInfer JIT cache
between machines (e.g. from a Docker build stage with nvcc to a runtime image without)."""

from __future__ import annotations

import argparse
import json
import sys

from flashinfer_sm120.errors import Sm120Error, UsageError
from flashinfer_sm120.safety.formats.base import bounded, plural, shown
from flashinfer_sm120.safety.formats.params import cli_size
from flashinfer_sm120.cli.common import err as _err
from flashinfer_sm120.core.facts.archopt import export_arch_list


def _doc(**fields) -> dict:
    """The one JSON document `cache export/import --json` print, the same fields for every outcome.  P8"""
    return {"ok": False, "error": None, "modules": [], "fingerprint": None, **fields}


def _failure(message: str, kind: str, fix: str) -> dict:
    """The document of a command line refused before the command ran (``--max-bytes foo``)."""
    return _doc(error={"kind": kind, "message": message, "fix": fix})


#: The fix a failure names when its error carries none, by the stage that failed: never an empty one.
_STAGE_FIX = {
    "usage": "see 'flashinfer-sm120 cache {command} --help'",
    "manifest": "give a manifest recorded with FLASHINFER_SM120_RECORD=<file> (docs/warmup.md)",
    "arch": "pass --arch with a major.minor target, e.g. 12.0 (RTX 5090, RTX PRO 6000) or 12.1 (DGX Spark)",
    "module": "name modules 'flashinfer-sm120 build --list' shows, built here first ('flashinfer-sm120 build MODULE')",
    "archive": "give a file or directory that 'flashinfer-sm120 cache export' wrote",
    "setup": "run 'flashinfer-sm120 doctor' to see what this machine lacks",
}


#: Kinds of failure that are the command line's: exit status 2 (as argparse's); any other is 1.
_USAGE = ("usage", "arch")


def _failed(args, doc: dict, kind: str, exc: BaseException) -> int:
    """Report ``exc`` (its kind, else the stage's) on stderr and with ``--json``; the exit status."""
    if isinstance(exc, OSError):
        from flashinfer_sm120.safety.oserrors import describe

        p = describe(exc, exc.filename or doc.get("out") or doc.get("src"))  # a failed write names no file
        kind, message, fix = p.kind, str(p), p.fix
    else:
        kind, message, fix = getattr(exc, "kind", None) or kind, str(exc), getattr(exc, "fix", "") or ""
    fix = fix or _STAGE_FIX.get(kind, _STAGE_FIX["setup"]).format(command="export" if "out" in doc else "import")
    doc.update(ok=False, error={"kind": kind, "message": bounded(message), "fix": bounded(fix)})
    if args.json:
        print(json.dumps(doc, indent=2))
    _err(message if fix in message else f"{message}; Fix: {fix}")  # the person reads the fix too (P8)
    return 2 if kind in _USAGE else 1


def run_export(args: argparse.Namespace) -> int:
    from flashinfer_sm120.warmup import cache, replay, session
    from flashinfer_sm120.warmup.modules import NAMES

    doc = _doc(out=args.out)
    if bool(args.manifest) == bool(args.modules or args.all):
        return _failed(args, doc, "usage", UsageError(
            "give one of module names, --all or --from MANIFEST", "name the modules to export (as for "
            "`flashinfer-sm120 build`), --all (every module built here that `build` can name), or --from MANIFEST"))
    if args.out in (*NAMES, "all"):  # `cache export sampling out.tar.gz`: the output path is the first word
        words = [args.out, *args.modules]
        paths = [w for w in words if w not in (*NAMES, "all")]
        return _failed(args, doc, "usage", UsageError(
            f"{shown(args.out)} is a module name where the output path comes first",
            f"flashinfer-sm120 cache export {shown(paths[0], 1000) if paths else 'OUT'} "
            f"{' '.join(w for w in words if w not in paths)} (to write a directory of that name: ./{args.out})"))
    stage = "exists"
    try:
        cache.check_out(args.out)  # threat-model: P4 (before FlashInfer is set up)
        stage = "manifest" if args.manifest else "module"
        arch = args.arch
        if args.manifest:
            labelled, skipped, sess = _manifest_entries(args)
        else:
            stage = "setup"
            session.apply_server_cache()  # the JIT dir the server installed here uses (SGLang's)
            stage = "arch"
            arch = args.arch or _built_arch()
            export_arch_list(arch)
            stage = "module"
            labelled, skipped, sess = replay.built_entries(
                args.modules, args.all, arch, head_dims=args.head_dim, dtypes=args.dtype,
                kv_dtypes=args.kv_dtype, acts=args.act)
        doc["fingerprint"] = sess.fingerprint()
        stage = "export"
        names = cache.export(labelled, sess, args.out, limits=_limits(args), rebuild=_rebuild(args, arch))
    except (Sm120Error, OSError) as exc:  # BuildError, ModuleError, FormatError...: one document each
        return _failed(args, doc, stage, exc)
    doc["modules"] = ([{"module": label, "name": n, "status": "exported"} for label, n in names]
                      + [{"module": n, "status": "not exported", "why": why} for n, why in skipped])
    doc.update(ok=True)
    for n, why in skipped:
        print(f"not exported {n}: {why}", file=sys.stderr)
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(f"exported {plural(len(names), 'module')} for {cache.nvcc_targets(sess.targets)} (FlashInfer "
          f"{sess.flashinfer}, CUDA {sess.cuda_version} at {sess.cuda_home}) to {args.out}")
    for label, _ in names:
        print(f"  {label}")
    return 0


def _rebuild(args: argparse.Namespace, arch: str | None) -> str:
    """The ``build`` command that makes what this export names, for the targets it exports (``arch``)."""
    import shlex

    words = ["flashinfer-sm120", "build", *(["--arch", arch] if arch else [])]
    if args.manifest:
        return shlex.join([*words, "--from", args.manifest])
    flags = [(f, v) for f, v in (("--head-dim", args.head_dim), ("--dtype", args.dtype),
                                 ("--kv-dtype", args.kv_dtype), ("--act", args.act)) if v]
    return shlex.join([*words, *args.modules, *(w for fv in flags for w in fv)])


def _built_arch() -> str | None:
    """Without --arch and a GPU: the one target set modules are built for here (``UsageError`` if none or
    several); None with a GPU (FlashInfer's targets come from it)."""
    from flashinfer_sm120.warmup.cache import built_targets
    from flashinfer_sm120.warmup.session import no_gpu_no_arch

    if not no_gpu_no_arch():
        return None
    built = built_targets()
    if not built:
        raise UsageError("no GPU is visible, no --arch was given, and nothing is built here to export",
                         "build first (flashinfer-sm120 build --arch 12.0 MODULE), or pass --arch with the targets "
                         "the modules were built for")
    if len(built) > 1:
        sets = "; ".join(f"{t} ({plural(n, 'module')})" for t, n in built.items())
        fix = f"pass --arch with the targets to export, e.g. --arch {next(iter(built)).split()[0]}"
        raise UsageError(f"no GPU is visible and modules are built here for several target sets: {sets}", fix)
    (targets,) = built
    print(f"flashinfer-sm120: no GPU visible; exporting what is built here for {targets}", file=sys.stderr)
    return targets


def _limits(args):
    from flashinfer_sm120.warmup.cache import Limits

    return Limits(max_total=args.max_bytes) if args.max_bytes else Limits()


def _manifest_entries(args):
    from flashinfer_sm120.warmup import replay, session

    entries, _problems = replay.load(args.manifest)
    session.apply_server_cache(None, entries)  # the JIT dir the recording server used (SGLang's)
    sess = session.prepare(replay.arch_for(entries, args.arch))
    regenerable = [e for e in entries if e.get("regenerable") and e.get("flashinfer") == sess.flashinfer]
    skipped = [(str(e.get("name")), e.get("why") or f"recorded with FlashInfer {e.get('flashinfer')}")
               for e in entries if e not in regenerable]
    return [(e["name"], e) for e in regenerable], skipped, sess


def run_import(args: argparse.Namespace) -> int:
    from flashinfer_sm120.warmup import cache_import, session

    doc = _doc(src=args.src)
    limits = _limits(args)
    stage = "archive"
    try:
        meta = cache_import.check(args.src, limits)  # before anything is imported or unpacked
        arch = args.arch if args.arch is not None else _archive_targets(meta)
        stage = "arch"
        export_arch_list(arch)
        stage = "setup"
        session.apply_server_cache()  # install where the server installed here will look (SGLang's dir)
        cache_import.precheck(args.src, meta)  # threat-model: P4 (before FlashInfer's set-up creates files)
        sess = session.prepare(arch)
        doc["fingerprint"] = sess.fingerprint()
        stage = "install"
        report = cache_import.install(args.src, meta, sess, force=args.force, limits=limits)
    except (Sm120Error, OSError) as exc:
        return _failed(args, doc, stage, exc)
    doc.update(ok=not any(r["status"] in ("stale", "kept existing", "refused", "failed") for r in report),
               modules=[{k: v for k, v in r.items() if k not in ("kind", "fix")} for r in report])
    failed = next((r for r in report if r["status"] == "failed"), None)
    if failed is not None:  # the modules before it stay installed, and are listed (P8)
        doc["error"] = {"kind": failed["kind"], "message": bounded(failed["why"]), "fix": bounded(failed["fix"])}
    stale = [r["module"] for r in report if r["status"] == "stale"]
    if stale and failed is None:  # installed, but a server here would rebuild them: say so (P8)
        doc["error"] = {"kind": "stale", "message": bounded(
            f"{plural(len(stale), 'module')} installed but would be rebuilt here: {', '.join(stale)} (each "
            f"module's why says the step)"), "fix": "build them here (flashinfer-sm120 build MODULE), or export from "
            "a machine with the same FlashInfer, CUDA and Python paths as this one"}
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        for r in report:
            why = f" ({r['why']})" if r.get("why") else ""
            rep = f" (replaced {', '.join(r['replaced'])})" if r.get("replaced") else ""
            print(f"{r['status']} {r['module']}{why}{rep}")
    if failed is not None:
        _err(failed["why"])
    return 0 if doc["ok"] else 1


def _archive_targets(meta) -> str | None:
    """The archive's targets when no GPU is visible, else None (the GPUs', checked to match)."""
    from flashinfer_sm120.warmup.cache import nvcc_targets
    from flashinfer_sm120.warmup.session import no_gpu_no_arch

    targets = meta.fingerprint["targets"]  # checked by cache.parse_meta: major.minor[a|f] each
    if targets and no_gpu_no_arch():
        print(bounded(f"flashinfer-sm120: no GPU visible; using the archive's targets {nvcc_targets(targets)}"),
              file=sys.stderr)
        return " ".join(targets)
    return None


def add_parsers(sub) -> None:
    """Register ``cache`` with its subcommands ``export`` and ``import``."""
    c = sub.add_parser("cache", help="move a warmed JIT cache between machines",
                       description="export/import a warmed FlashInfer JIT cache")
    cs = c.add_subparsers(dest="cache_cmd", required=True, metavar="{export,import}")
    e = cs.add_parser("export", help="write modules built here (by name, --all, or a manifest's) to a "
                      "directory or archive", description="Write FlashInfer JIT modules built in this "
                      "workspace to a new directory or archive that `cache import` installs on a machine "
                      "with the same FlashInfer, toolkit path and targets, without compiling. Exit status 0: "
                      "exported; 1: refused or failed (the message says why and the fix); 2: bad usage.")
    e.add_argument("out", help="new directory, or an archive path ending .tar, .tar.gz or .tgz (another "
                   "archive name is bad usage, exit 2)")
    e.add_argument("modules", nargs="*", metavar="MODULE",
                   help="modules as named for `flashinfer-sm120 build` (see build --list)")
    e.add_argument("--all", action="store_true", help="every module built here that `build` can name "
                   "(with the variant flags below)")
    e.add_argument("--from", dest="manifest", metavar="MANIFEST",
                   help="the modules of a manifest recorded with FLASHINFER_SM120_RECORD (built here)")
    e.add_argument("--arch", help="targets, as for build (default: the manifest's, else the GPUs present, "
                   "else the one target set the modules are built for here)")
    e.add_argument("--head-dim", help="attention head dims the modules were built with (as for build)")
    e.add_argument("--dtype", help="attention q/o dtype(s) (as for build)")
    e.add_argument("--kv-dtype", help="KV-cache dtype(s) (as for build)")
    e.add_argument("--act", help="activation(s) for 'activation' (as for build)")
    e.add_argument("--max-bytes", type=cli_size("--max-bytes", 1 << 20), metavar="SIZE",
                   help="refuse to write more than SIZE (e.g. 8G; default 32G)")
    e.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    e.set_defaults(func=run_export, json_failure=_failure)
    i = cs.add_parser("import", help="install an exported JIT cache into FlashInfer's JIT cache here",
                      description="Install an export written by `cache export` into FlashInfer's JIT cache here. "
                      "Exit status 0: every module installed or already present; 1: refused, failed, or a "
                      "module not installed (each says why and the fix); 2: bad usage.")
    i.add_argument("src", help="directory or archive written by 'cache export'")
    i.add_argument("--arch", help="targets (default: the GPUs present, else the archive's)")
    i.add_argument("--force", action="store_true", help="replace existing entries that differ")
    i.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    i.add_argument("--max-bytes", type=cli_size("--max-bytes", 1 << 20), metavar="SIZE",
                   help="refuse an export whose files add up to more than SIZE (e.g. 8G; default 32G)")
    i.set_defaults(func=run_import, json_failure=_failure)
