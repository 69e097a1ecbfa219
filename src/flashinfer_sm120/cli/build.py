"""``flashinfer-sm120 build``: JIT-build FlashInfer modules into FlashInfer's JIT cache now, by name
(``build sampling decode --head-dim 128``) or as recorded (``build --from MANIFEST``); its flags,
the compiler cache they ask for, and its output (the JSON document: :mod:`.buildjson`)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from flashinfer_sm120.core.facts.arch import nvcc_spelling
from flashinfer_sm120.errors import Sm120Error, UsageError
from flashinfer_sm120.safety.formats.params import cli_int, cli_size
from flashinfer_sm120.warmup import modules as _modules
from flashinfer_sm120.cli import buildjson
from flashinfer_sm120.cli.common import apply_arch


def run_build(args: argparse.Namespace) -> int:
    if args.list:  # with --json, a document too (threat-model: P8)
        if args.json:
            print(json.dumps({"ok": True, "error": None, "modules": [
                {"name": name, "what": n.what, "needs": list(n.headers)} for name, n in _modules.NAMES.items()],
                "dtypes": list(_modules.DTYPES), "activations": list(_modules.ACTIVATIONS)}, indent=2))
        else:
            print(_modules.describe_all())
        return 0
    try:
        doc = _build(args)
    except Sm120Error as exc:  # a build that cannot start (a bad module, manifest or --arch, no ninja, a refused
        raise UsageError(str(exc), exc.fix) from exc  # cache ...) exits 2, printed by cli.main as its document (P8)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        _print_human(doc)
    return 0 if doc["ok"] else 1


def _build(args: argparse.Namespace) -> dict:
    """Set up, build, and return the ``build --json`` document; :raises Sm120Error: it cannot start."""
    from flashinfer_sm120.core.jitenv import launcher, toolchain
    from flashinfer_sm120.safety import compilers
    from flashinfer_sm120.warmup import moddir, plan, replay, session
    from flashinfer_sm120.warmup.session import BuildError

    if not args.modules and not args.manifest:
        raise BuildError("name the modules to build (see `flashinfer-sm120 build --list`) or give "
                         "--from MANIFEST (recorded with FLASHINFER_SM120_RECORD)")
    user_env = dict(os.environ)  # the user's, before anything is exported (the plan reads their MAX_JOBS)
    if args.compiler_cache:  # acted on before FlashInfer is set up
        os.environ[compilers.CACHE_ENV] = "off" if args.compiler_cache == "none" else args.compiler_cache
        if args.compiler_cache == "sccache":
            toolchain.request_from_flag("--compiler-cache sccache")
    variants = _modules.expand(args.modules, head_dims=args.head_dim, dtypes=args.dtype,
                               kv_dtypes=args.kv_dtype, acts=args.act) if args.modules else []
    entries, problems = replay.load(args.manifest) if args.manifest else ([], [])
    arch = replay.arch_for(entries, args.arch) if args.manifest else args.arch
    if arch is None and session.no_gpu_no_arch():  # before FlashInfer's import: it takes seconds
        raise BuildError(session.NO_TARGETS)
    apply_arch(arch)
    served = session.apply_server_cache(args.for_server, entries)
    # --arch reaches FlashInfer as FLASHINFER_CUDA_ARCH_LIST: the summary names what the user typed
    sess = session.prepare(f"from --arch {args.arch}" if args.arch else "from the manifest" if arch else None)
    own = session.apply_server_arch(served["server"], sess)  # the server's model processes' own targets
    print(f"flashinfer-sm120: {sess.summary}", file=sys.stderr)
    if served["server"]:
        print(f"flashinfer-sm120: building into {served['server']}'s JIT directory ({served['why']}): "
              f"{sess.jit_dir} ({served['how']})", file=sys.stderr)
    if own:
        print(f"flashinfer-sm120: {own.name} will build for {', '.join(own.targets)} (its {own.function} sets "
              f"{own.variable}={own.value} after FlashInfer's import; {own.how}): building that, as it will "
              f"request it, in the JIT directory of {', '.join(nvcc_spelling(t) for t in sess.targets)}", file=sys.stderr)
    tk = sess.toolkit  # the Toolkit the patch chose (None: noop, FlashInfer's own was right)
    missing = [] if args.ninja_only else _modules.missing_headers(
        variants, [os.path.join(sess.cuda_home, "include"), *(tk.include_dirs if tk else ()), "/usr/include"],
        ".".join(str(sess.cuda_version).split(".")[:2]), tk is not None and "pip" in tk.sources,
        tk.root if tk else sess.cuda_home)
    variants, left_out = _leave_out(args, variants, missing)
    missing = [m for m in missing if set(m[0]) - {r["module"] for r in left_out}]
    if missing:  # before anything compiles: nvcc would stop on the #include minutes later
        raise BuildError("; ".join(f"{why}. Fix: {fix}, or leave {', '.join(labels)} out" for labels, why, fix in missing))
    setup = _setup_of(sess)
    kind, problem = compilers.requested()  # a compiler cache asked for (flag or variable) and refused
    refused = problem or (setup.cache.get("refused") if kind or os.environ.get("FLASHINFER_NVCC_LAUNCHER") is None
                          else None)
    if refused:
        raise BuildError(refused)
    if not args.ninja_only:  # before anything is generated: the same refusal for every module
        moddir.ninja_binary()
    before = launcher.stats()
    for p in problems:
        print(f"flashinfer-sm120: manifest: {p}", file=sys.stderr)
    labelled, not_made = replay.specs(variants, entries, sess.flashinfer)
    for name, why in not_made:
        print(f"cannot regenerate {name}: {why}", file=sys.stderr)
    for e in entries:
        if e.get("targets") and sorted(e["targets"]) != sess.targets and e.get("regenerable"):
            print(f"note: {e['name']} was recorded for {' '.join(e['targets'])}, building for "
                  f"{' '.join(sess.targets)}", file=sys.stderr)
    labelled, shipped = _not_shipped(labelled, sess)
    stats: dict = {}
    if args.ninja_only:
        plan.write_ninjas([s for _, s in labelled])
        results = [{"module": label, "name": s.name, "status": "ninja written", "ninja": str(s.ninja_path)}
                   for label, s in labelled]
    else:
        results = plan.build_specs(labelled, args.jobs, sys.stderr, stats, targets=len(sess.targets),
                                      mem_limit=args.mem_limit, mem_per_compile=args.mem_per_compile,
                                      env=user_env, step_timeout=args.step_timeout * 60)
    results = left_out + shipped + results  # each said on stderr as not built, and why
    flag_only = args.compiler_cache == "sccache" and not user_env.get(compilers.CACHE_ENV)
    cache = None if args.ninja_only else _cache_report(before, flag_only)
    if cache:
        print(cache["line"], file=sys.stderr)
    # a module named or recorded as regenerable that cannot be made here, or a refused line, is not built
    # either, and not ok (P8); one recorded as not regenerable (a cute_dsl module) is named in cannot_regenerate only
    unmade = {e.get("name") for e in entries if not e.get("regenerable")}
    failed = ([n for n, _ in not_made if n not in unmade]
              + [r["module"] for r in results if r["status"] == "failed"])
    error = "; ".join(filter(None, (
        f"{len(failed)} module(s) not built: {', '.join(failed)}"
        + (" (cannot_regenerate says why, and the fix)" if not_made else "") if failed else None,
        f"{len(problems)} manifest line(s) refused (above)" if problems else None))) or None
    return buildjson.document(
        error, cuda_home=sess.cuda_home, cuda_version=sess.cuda_version, flashinfer=sess.flashinfer,
        target_cuda_archs=[nvcc_spelling(t) for t in sess.targets], jit_dir=str(sess.jit_dir), server=served,
        server_arch=own and {k: getattr(own, k) for k in ("variable", "value", "targets", "function", "how")},
        targets_from=sess.targets_from, pool_wall_s=stats.get("wall_s"),
        modules=results, plan=stats.get("plan"), compiler_cache=cache,
        cannot_regenerate=[{"name": n, "why": w} for n, w in not_made],
        refused_settings=list(setup.refused))  # built without these (P2, P8)


def _leave_out(args: argparse.Namespace, variants: list, missing: list) -> tuple[list, list[dict]]:
    """``all`` is every module this toolkit can build: one that lacks a header and was not named besides ``all``
    is left out with a note (why, and how to get it); a named one is refused with the fix."""
    if "all" not in args.modules:
        return variants, []
    named = {v.label for v in _modules.expand([n for n in args.modules if n != "all"], head_dims=args.head_dim,
                                              dtypes=args.dtype, kv_dtypes=args.kv_dtype, acts=args.act)}
    out, arch = [], f"--arch {args.arch} " if args.arch else ""
    for labels, why, fix in missing:
        for label in labels:
            if label not in named:
                note = f"{why}; to build it: {fix}, then flashinfer-sm120 build {arch}{label}"
                print(f"flashinfer-sm120: all: left out {label}: {note}", file=sys.stderr)
                out.append({"module": label, "status": "left out", "why": note})
    return [v for v in variants if v.label not in {r["module"] for r in out}], out


def _not_shipped(labelled: list, sess) -> tuple[list, list[dict]]:
    """``labelled`` less what a matching jit-cache provider ships (FlashInfer loads that), and their results."""
    from flashinfer_sm120.core.facts import precompiled

    pc = precompiled.read()
    targets = [precompiled.tag(t) for t in sess.targets]
    keep, shipped = [], []
    for label, spec in labelled:
        p = pc.shipped_by(spec.name, targets)
        if p is None:
            keep.append((label, spec))
            continue
        print(f"flashinfer-sm120: {label}: not built: {p.distribution} {p.version} ships {spec.name} for "
              f"{', '.join(targets)} (FlashInfer loads it instead of a JIT build)", file=sys.stderr)
        shipped.append({"module": label, "name": spec.name, "status": "shipped",
                        "provider": f"{p.distribution} {p.version}"})
    return keep, shipped


def _print_human(summary: dict) -> None:
    origin = f" ({summary['targets_from']})" if summary.get("targets_from") else ""
    targets = f"targets {', '.join(summary['target_cuda_archs'])}{origin}"
    own = summary.get("server_arch")  # what the server's model process requests, built in that JIT directory
    if own:
        targets = f"targets {', '.join(own['targets'])} ({own['variable']}={own['value']}, as the server sets it) " \
                  f"in the JIT directory of {', '.join(summary['target_cuda_archs'])}{origin}"
    print(f"nvcc: {summary['cuda_home']}/bin/nvcc (CUDA {summary['cuda_version']}); {targets}")
    from flashinfer_sm120.core.jitenv.memory import fmt_bytes

    libs = [r["library"] for r in summary["modules"] if r.get("library")]
    where = os.path.dirname(os.path.dirname(libs[0])) if libs else None
    for r in summary["modules"]:
        if r["status"] == "ninja written":
            print(f"ninja written {r['module']}: {r['ninja']}")
        elif r["status"] == "left out":
            print(f"left out {r['module']}: {r['why']}")
        elif r["status"] == "shipped":
            print(f"shipped {r['module']}: not built, {r['provider']} has it for these targets")
        elif r["status"] == "failed":
            print(f"FAILED {r['module']}:\n    " + (r["error"] or "").replace("\n", "\n    "))
        else:  # the directory once, below: each path holds FlashInfer's long module name twice
            at = "" if os.path.dirname(os.path.dirname(r["library"])) == where else f" at {r['library']}"
            print(f"{r['status']} {r['module']} ({fmt_bytes(r['bytes'])}, {r['seconds']} s; {', '.join(r['binary'])}){at}")
    if where:
        print(f"libraries in {where} (one directory per FlashInfer module; --json gives each path)")
    for r in summary["modules"]:
        for c in r.get("build_vars_before") or ():
            print(f"note: {r['module']} was built with {c['name']}={c['built'] or '(unset)'}, now "
                  f"{c['now'] or '(unset)'}: it was rebuilt, and a process with the old value rebuilds it again")
        if r.get("build_vars_unrecorded"):
            print(f"note: {r['module']}: its build-line variables were not recorded: {r['build_vars_unrecorded']}")
    for s in summary["cannot_regenerate"]:
        print(f"cannot regenerate {s['name']}: {s['why']}")


def _setup_of(sess):
    """This process's toolchain ``Setup``, made here when FlashInfer's hooks made none (not patched)."""
    from flashinfer_sm120.core.jitenv import toolchain

    toolchain.prepare_builds()  # what the patch leaves to the first JIT build, done now
    setup = toolchain.last()
    if setup is not None:
        return setup
    targets = [(int(t.split(".")[0]), t.split(".")[1]) for t in sess.targets if "." in t]
    setup = toolchain.configure(sess.cuda_home, os.path.join(sess.cuda_home, "bin", "nvcc"), targets)
    for name in setup.pop:
        os.environ.pop(name, None)
    os.environ.update(setup.set)
    return setup


def _cache_report(before: dict | None, flag_only: bool) -> dict | None:
    """``build --json``'s ``compiler_cache``: the sccache server's hits and misses since ``before`` (other builds
    sharing it count too), where it keeps its cache, and the ``line`` said; ``None`` without a launcher."""
    from flashinfer_sm120.core.jitenv import launcher
    from flashinfer_sm120.safety.compilers import CACHE_ENV
    from flashinfer_sm120.safety.formats.base import shown

    if before is None:
        return None
    after = launcher.stats() or {}
    b, a = launcher.hits_misses(before) or (0, 0), launcher.hits_misses(after)
    location = after.get("cache_location") or "?"
    hits, misses = (None, None) if a is None else (a[0] - b[0], a[1] - b[1])
    line = ("compiler cache: sccache did not report its stats" if a is None else f"compiler cache: {hits} hits, "
            f"{misses} misses in this build (sccache {after.get('version', '?')}, {shown(location, 120)})")
    if flag_only and a is not None:  # --compiler-cache sccache while the variable is not set for the servers
        line += (f"\nnote: set {CACHE_ENV}=sccache for the servers that load these modules too: the launcher is part "
                 "of the compile line ninja records, so a server without it compiles them again")
    return {"hits": hits, "misses": misses, "location": location, "line": line}


def add_parser(sub) -> None:
    """Register ``build`` on an argparse subparsers object."""
    # what may fail to import comes before sub.add_parser: a broken install fails here, not half-registered
    from flashinfer_sm120.warmup.pool import STEP_TIMEOUT_S
    from flashinfer_sm120.warmup.session import SERVER_CHOICES as servers
    from flashinfer_sm120.safety.compilers import CACHE_ENV as ENV
    b = sub.add_parser("build", help="JIT-build FlashInfer modules into FlashInfer's JIT cache",
                       description="Build named modules (see --list) or a recorded manifest (--from) "
                       "in one job pool.")
    b.add_argument("modules", nargs="*", metavar="MODULE", help=f"one of: {', '.join(_modules.NAMES)}, all")
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
    b.add_argument("--step-timeout", type=cli_int("--step-timeout", 1, 10080), default=STEP_TIMEOUT_S // 60,
                   metavar="MINUTES", help="stop a compile or link step that runs longer (with what it "
                   "started), and fail its module (default %(default)s)")
    b.add_argument("--ninja-only", action="store_true",
                   help="write FlashInfer's build.ninja files, compile nothing")
    b.add_argument("--json", action="store_true", help="print the result as JSON on stdout (one document, "
                   "whatever the outcome: 'ok' and 'error' say how it ended)")
    b.set_defaults(func=run_build, json_failure=buildjson.failure)
    b.add_argument("--compiler-cache", choices=("sccache", "none"),
                   help="compile through a shared compile cache (sccache; its backend is sccache's own "
                        f"SCCACHE_* configuration); default: ${ENV}, else none")
    b.add_argument("--mem-limit", type=cli_size("--mem-limit", 64 << 20), metavar="SIZE",
                   help="memory the compiles may use together, e.g. 8G (default: what this process "
                        "may use, from cgroups and /proc/meminfo, less 15%%)")
    b.add_argument("--mem-per-compile", type=cli_size("--mem-per-compile", 16 << 20),
                   metavar="SIZE", help="memory one compile takes, e.g. 2G (default: per module family, "
                                        "refined from the peaks recorded by earlier builds)")
