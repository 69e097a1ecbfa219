"""``flashinfer-sm120 build``: JIT-build FlashInfer modules into FlashInfer's JIT cache now,
by name (``build sampling decode --head-dim 128``) or as recorded (``build --from MANIFEST``);
``cache export``/``cache import`` move a warmed JIT cache to other machines."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

from ..warmup import modules as _modules
from ..formats import cli_int
from .common import err as _err

__all__ = ["MODULES", "run_build", "add_parser"]

#: Module names ``build`` knows (see ``build --list``).
MODULES = _modules.NAMES


def run_build(args: argparse.Namespace) -> int:
    from ..warmup import ninjacmd, replay, session

    if args.list:
        print(_modules.describe_all())
        return 0
    if not args.modules and not args.manifest:
        return _err("name the modules to build (see `flashinfer-sm120 build --list`) or give "
                    "--from MANIFEST (recorded with FLASHINFER_SM120_RECORD)")
    from ..warmup import buildopts

    user_env = buildopts.apply(args)  # --compiler-cache; the user's env before anything is exported
    try:
        variants = _modules.expand(args.modules, head_dims=args.head_dim, dtypes=args.dtype,
                                   kv_dtypes=args.kv_dtype, acts=args.act) if args.modules else []
        entries, problems = replay.load(args.manifest) if args.manifest else ([], [])
        arch = replay.arch_for(entries, args.arch) if args.manifest else args.arch
        for note in arch_notes(args.arch):
            print(f"flashinfer-sm120: {note}", file=sys.stderr)
        session.set_arch(arch)
        served = session.apply_server_cache(args.for_server, entries)
        sess = session.prepare(arch)
        own = session.apply_server_arch(served["server"], sess)
    except (_modules.ModuleError, session.BuildError) as exc:
        return _err(str(exc))
    origin = _targets_origin(args.arch, arch)
    if origin:  # --arch reaches FlashInfer as FLASHINFER_CUDA_ARCH_LIST: name what the user typed
        sess.summary = re.sub(r"from FLASHINFER_CUDA_ARCH_LIST='[^']*'", origin, sess.summary)
    print(f"flashinfer-sm120: {sess.summary}", file=sys.stderr)
    if served["server"]:
        print(f"flashinfer-sm120: building into {served['server']}'s JIT directory ({served['why']}): "
              f"{sess.jit_dir} ({served['how']})", file=sys.stderr)
    if own:
        print(f"flashinfer-sm120: {own.name} will build for {', '.join(own.targets)} (its {own.function} sets "
              f"{own.variable}={own.value} after FlashInfer's import; {own.how}): building that, as it will "
              f"request it, in the JIT directory of {', '.join(_sm(t) for t in sess.targets)}", file=sys.stderr)
    missing = _missing_headers(variants, sess) if not args.ninja_only else []
    if missing:  # before anything compiles: nvcc would stop on the #include minutes later
        return _err("; ".join(missing))
    refused = buildopts.refused(args, sess)
    if refused:
        return _err(refused)
    if not args.ninja_only:  # before anything is generated: the same refusal for every module
        try:
            ninjacmd.ninja_binary()
        except RuntimeError as exc:
            return _err(str(exc))
    before = buildopts.cache_stats()
    for p in problems:
        print(f"flashinfer-sm120: manifest: {p}", file=sys.stderr)
    labelled, not_generated = [], []
    for v in variants:
        try:
            labelled.append((v.label, v.spec()))
        except Exception as exc:  # FlashInfer refuses this combination: say so, build the rest
            not_generated.append(v.label)
            print(f"cannot generate {v.label}: FlashInfer's {v.generator} raised {exc!r}", file=sys.stderr)
    regenerated, skipped = replay.regenerate(entries, sess.flashinfer)
    labelled += regenerated
    for name, why in skipped:
        print(f"cannot regenerate {name}: {why}", file=sys.stderr)
    for e in entries:
        if e.get("targets") and sorted(e["targets"]) != sess.targets and e.get("regenerable"):
            print(f"note: {e['name']} was recorded for {' '.join(e['targets'])}, building for "
                  f"{' '.join(sess.targets)}", file=sys.stderr)
    if args.ninja_only:
        session.write_ninjas([s for _, s in labelled])
        pool_wall = occupancy = None
        results = [{"module": label, "name": s.name, "status": "ninja written", "ninja": str(s.ninja_path)}
                   for label, s in labelled]
    else:
        stats: dict = {}
        results = session.build_specs(labelled, args.jobs, sys.stderr, stats, targets=len(sess.targets),
                                      mem_limit=args.mem_limit, mem_per_compile=args.mem_per_compile,
                                      env=user_env)
        pool_wall, occupancy = stats.get("wall_s"), stats.get("occupancy")
    cache = None if args.ninja_only else buildopts.cache_report(before)
    if cache:
        print(cache["line"], file=sys.stderr)
    summary = {"cuda_home": sess.cuda_home, "cuda_version": sess.cuda_version,
               "flashinfer": sess.flashinfer, "target_cuda_archs": [_sm(t) for t in sess.targets],
               "jit_dir": str(sess.jit_dir), "server": served,
               "server_arch": own and {"variable": own.variable, "value": own.value, "targets": list(own.targets),
                                       "function": own.function, "how": own.how},
               "targets_from": origin or _origin_from_summary(sess.summary),
               "pool_wall_s": pool_wall, "pool_occupancy": occupancy, "modules": results,
               "plan": None if args.ninja_only else stats.get("plan"),
               "pool_timeline": None if args.ninja_only else stats.get("timeline"),
               "compiler_cache": cache, "cannot_regenerate": [{"name": n, "why": w} for n, w in skipped]}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _print_human(summary)
    return 1 if not_generated or any(r["status"] == "failed" for r in results) else 0


def session_choices() -> tuple[str, ...]:
    from ..warmup.session import SERVER_CHOICES

    return SERVER_CHOICES


def _sm(target: str) -> str:
    return "sm_" + target.replace(".", "")


def arch_notes(value: str | None) -> list[str]:
    """How ``--arch`` was read, for entries not already written as ``major.minor[a|f]``:
    ``--arch 120`` -> ``'120' read as 12.0``; bad entries are left to :func:`session.set_arch`."""
    if not value:
        return []
    from .. import arch as _arch

    notes = []
    for entry in (e for e in re.split(r"[\s,;]+", value.strip()) if e):
        try:
            (spec,) = _arch.parse_arch_list(entry, source="--arch")
        except (_arch.ArchListError, ValueError):
            continue
        canon = f"{spec.major}.{spec.minor}{spec.suffix or ''}"
        if entry != canon:
            dropped = " (+PTX dropped: FlashInfer builds machine code only)" if entry.upper().endswith("+PTX") else ""
            notes.append(f"--arch {entry!r} read as {canon} (compute capability {spec.major}.{spec.minor}){dropped}")
    return notes


def _targets_origin(given: str | None, used: str | None) -> str | None:
    """``from --arch X`` or ``from the manifest``, when the CLI chose the targets."""
    if given:
        return f"from --arch {given}"
    if used:
        return "from the manifest"
    return None


def _origin_from_summary(summary: str) -> str | None:
    m = re.search(r"targets [^;]*? \((from [^)]*|GPUs from [^)]*)\)", summary)
    return m.group(1) if m else None


def _missing_headers(variants: list, sess) -> list[str]:
    """:func:`modules.missing_headers` for the chosen toolkit (where nvcc looks, and whether it is pip's)."""
    import flashinfer_sm120 as shim

    tk = ((shim.status().get("resolution") or {}).get("choice") or {}).get("toolkit") or {}
    dirs = [os.path.join(sess.cuda_home, "include"), *tk.get("include_dirs", ()), "/usr/include"]
    release = ".".join(str(sess.cuda_version).split(".")[:2])
    return _modules.missing_headers(variants, dirs, release, "pip" in tk.get("sources", ()),
                                    tk.get("root") or sess.cuda_home)


def _print_human(summary: dict) -> None:
    origin = f" ({summary['targets_from']})" if summary.get("targets_from") else ""
    print(f"nvcc: {summary['cuda_home']}/bin/nvcc (CUDA {summary['cuda_version']}); "
          f"targets {', '.join(summary['target_cuda_archs'])}{origin}")
    for r in summary["modules"]:
        if r["status"] == "ninja written":
            print(f"ninja written {r['module']}: {r['ninja']}")
        elif r["status"] == "failed":
            print(f"FAILED {r['module']}:\n    " + (r["error"] or "").replace("\n", "\n    "))
        else:
            print(f"{r['status']} {r['module']}: {r['library']} ({r['bytes']} bytes, {r['seconds']} s; "
                  f"{', '.join(r['binary'])})")
    for r in summary["modules"]:
        for c in r.get("build_vars_before") or ():
            print(f"note: {r['module']} was built with {c['name']}={c['built'] or '(unset)'}, now "
                  f"{c['now'] or '(unset)'}: it was rebuilt, and a process with the old value rebuilds it again")
        if r.get("build_vars_unrecorded"):
            print(f"note: {r['module']}: its build-line variables were not recorded: {r['build_vars_unrecorded']}")
    for s in summary["cannot_regenerate"]:
        print(f"cannot regenerate {s['name']}: {s['why']}")


def add_parser(sub) -> None:
    """Register ``build`` and ``cache`` on an argparse subparsers object."""
    servers = session_choices()  # before add_parser: a broken install fails here, not half-registered
    b = sub.add_parser("build", help="JIT-build FlashInfer modules into FlashInfer's JIT cache",
                       description="Build named modules (see --list) or a recorded manifest (--from) "
                       "in one job pool.")
    b.add_argument("modules", nargs="*", metavar="MODULE", help=f"one of: {', '.join(MODULES)}, all")
    b.add_argument("--list", action="store_true", help="list the modules and their variant flags")
    b.add_argument("--from", dest="manifest", metavar="MANIFEST",
                   help="build the modules recorded in MANIFEST (FLASHINFER_SM120_RECORD=MANIFEST)")
    b.add_argument("--arch", help="compute capabilities, e.g. '12.0' or '12.0 12.1' (default: the "
                   "manifest's targets, else the GPUs present); sets FLASHINFER_CUDA_ARCH_LIST")
    b.add_argument("--for", dest="for_server", choices=servers,
                   help="build into this server's JIT directory (SGLang moves FlashInfer's cache to "
                   "SGLANG_CACHE_DIR); default: the server the manifest was recorded under, else the one "
                   "installed here")
    b.add_argument("--jobs", "-j", type=cli_int("-j", 1, 4096), help="parallel compile steps (default: MAX_JOBS, else "
                   "the CPUs available)")
    b.add_argument("--head-dim", help="attention head dims, e.g. 64,128 (default 128)")
    b.add_argument("--dtype", help="attention q/o dtype(s), e.g. bf16,fp16 (default bf16)")
    b.add_argument("--kv-dtype", help="KV-cache dtype(s), e.g. fp8_e4m3 (default: --dtype)")
    b.add_argument("--act", help="activation(s) for 'activation', e.g. silu,gelu_tanh (default silu)")
    b.add_argument("--ninja-only", action="store_true",
                   help="write FlashInfer's build.ninja files, compile nothing")
    b.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    from ..warmup import buildopts

    buildopts.add_arguments(b)
    b.set_defaults(func=run_build)
    from . import cache as _cache

    _cache.add_parsers(sub)
