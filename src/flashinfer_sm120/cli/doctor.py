"""``flashinfer-sm120 doctor``: the verdict, whole, on the first line, then one screen of facts; ``--verbose`` adds
the report as ``--json`` prints it (one report, P7), collected and judged in :mod:`flashinfer_sm120.diagnose.verify`."""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import logging
import os
import re
import sys
import textwrap

from flashinfer_sm120.safety.formats.base import MAX_MESSAGE, bounded, plural, printable, shown
from flashinfer_sm120.safety.formats.params import cli_float
from flashinfer_sm120.diagnose.verify.diagnosis import SETTING, VERDICT_NOTES
from flashinfer_sm120.diagnose.verify.report import ALONE_TIMEOUT_S, collect
from flashinfer_sm120.cli.common import ARCH_HELP, apply_arch

#: Exit status -> meaning (``doctor --help`` and docs/cli.md).
EXIT_CODES = {0: "OK: FlashInfer will build (warnings may follow)",
              1: "PROBLEM: FlashInfer's JIT builds will fail here (the first line says why and the fix)",
              2: "bad usage (an unknown option, a bad --arch)"}
#: Lines of the default report at most (findings give way first).
SHORT_LINES = 25
#: Characters per line of the default report.  Text wraps at spaces only: a path, command or fix is
#: never cut; one longer than this gets a line of its own (copied whole).
WIDTH = 120


def run_doctor(args: argparse.Namespace) -> int:
    from flashinfer_sm120.core.facts.reinstall import require_dependencies

    require_dependencies()  # a missing one: cli.main prints it with its fix (as JSON too with --json)
    apply_arch(args.arch)  # a bad value: UsageError, printed by cli.main (as JSON too with --json)
    os.environ.setdefault("FLASHINFER_SM120_QUIET", "1")  # the report says what the log line would
    from flashinfer_sm120.diagnose.verify.diagnosis import diagnose

    # the verdict is the first line anyone reads: a progress note only on a terminal, erased before it
    tty = not args.json and sys.stderr.isatty()
    say = (lambda m: print(m, end="", file=sys.stderr, flush=True)) if tty else None
    try:  # the installed server's cache redirection (SGLang), before FlashInfer is imported
        from flashinfer_sm120.warmup.session import apply_server_cache

        server_cache = apply_server_cache(strict=False)
    except Exception as exc:
        server_cache = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    from flashinfer_sm120.core.facts import precompiled
    from flashinfer_sm120.diagnose.verify import report as part
    from flashinfer_sm120.warmup import plan

    log = logging.getLogger("flashinfer_sm120")
    level = log.level
    log.setLevel(logging.CRITICAL)  # the report says what its log lines would (the guard's message is line 1)
    try:
        report = collect(args.timeout or ALONE_TIMEOUT_S, say=say, server_cache=server_cache, arch=args.arch, sections=(
            ("ninja", part.ninja_section), ("servers", part.servers_section), ("build_line", part.build_line_section),
            ("builds", plan.doctor_section), ("precompiled", precompiled.doctor_section)))
    finally:
        log.setLevel(level)
    if tty:
        print("\r\033[K", end="", file=sys.stderr, flush=True)
    diagnosis = diagnose(report)
    report["diagnosis"] = diagnosis.to_dict()
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        for line in render(report, verbose=args.verbose, diagnosis=diagnosis):
            print(printable(line))  # threat-model: P8: names found on disk are shown, never acted on
    return 0 if diagnosis.ok else 1


def render(report: dict, *, verbose: bool = False, diagnosis=None) -> list[str]:
    """The verdict, then one screen (:data:`SHORT_LINES`: findings whole, as many as fit, then a pointer); with
    ``verbose`` every finding, the same facts, then the whole report."""
    from flashinfer_sm120.diagnose.verify.diagnosis import diagnose

    d = diagnosis or diagnose(report)
    facts = [ln for text in _facts(report, d) for ln in wrap(text)]
    # the findings that qualify the verdict: on the OK line, or (toolkit settings) right after a PROBLEM
    notes = [f for f in d.findings if f.code in VERDICT_NOTES and (not d.problems or f.code == SETTING)]
    head = [_verdict(d)] + [_finding(f) for f in notes if d.problems]  # whole, as the verdict line
    blocks = [wrap(_finding(f)) for f in d.findings if f not in notes and f is not (d.problems or (None,))[0]]
    if verbose:
        whole = json.dumps({k: v for k, v in report.items() if k != "diagnosis"}, indent=2, default=str)
        return head + [ln for block in blocks for ln in block] + facts + [
            "", "The whole report, as doctor --json prints it:"] + [  # P6: each line bounded
            bounded(ln, max_word=MAX_MESSAGE) for ln in whole.splitlines()]
    tail = wrap("More: flashinfer-sm120 doctor --verbose (every toolkit, the patch, exports, servers), or --json")
    room = SHORT_LINES - len(head) - len(facts) - len(tail)
    if sum(map(len, blocks)) > room:  # as many whole findings as fit, then one line saying how many more
        fit = sum(1 for total in itertools.accumulate(map(len, blocks)) if total <= room - 1)
        blocks = blocks[:fit] + [[f"... {plural(len(blocks) - fit, 'more finding')}: --verbose"]]
    return head + facts + [ln for block in blocks for ln in block] + tail


# --------------------------------------------------------------------------- rendering


def wrap(text: str, indent: str = "  ") -> list[str]:
    """``text`` wrapped at :data:`WIDTH` at spaces only, later lines indented."""
    return textwrap.wrap(text, WIDTH, subsequent_indent=indent, break_long_words=False,
                         break_on_hyphens=False) or [text]


def _finding(f) -> str:
    return f"{f.level.value.upper()}: {f.text}" + (f". Fix: {f.fix}" if f.fix else "")


def _verdict(d) -> str:
    """The first line, whole: a reader of one line gets the verdict and the fix."""
    if d.problems:  # a multi-line message (a resolution error) joined: the verdict line holds all of it
        return re.sub(r"[ \t]*[\r\n]+[ \t]*", " ", _finding(d.problems[0]))
    return f"OK: FlashInfer will build {', '.join(d.targets)} with nvcc {d.nvcc} at {d.root}" + "".join(
        f"; but {f.text}" + (f" (fix: {f.fix})" if f.fix else "") for f in d.findings if f.code in VERDICT_NOTES)


def _versions(r: dict) -> str:
    torch = ("torch not installed" if r.get("torch_from") is None
             else f"torch {r.get('torch_version') or '?'} (CUDA {r['torch_cuda']})" if r.get("torch_cuda")
             else f"torch {r.get('torch_version') or '?'} (CPU build)")
    fi = f"FlashInfer {r['flashinfer']}" if r.get("flashinfer_installed") else "FlashInfer not installed"
    return f"Versions: flashinfer-sm120 {r['flashinfer_sm120']}, {fi}, {torch}"


def _targets_from(r: dict) -> str:
    res = r.get("resolution") or {}
    if r.get("arch_option"):  # accepted by the arch grammar: short and printable
        return f"from --arch {r['arch_option']}"
    if r.get("FLASHINFER_CUDA_ARCH_LIST") is not None and not res.get("arch_list_error"):
        return f"from FLASHINFER_CUDA_ARCH_LIST={shown(r['FLASHINFER_CUDA_ARCH_LIST'], 40)}"
    return "for the GPUs present"


def _toolkit(r: dict) -> list[str]:
    res = r.get("resolution")
    states = collections.Counter(c.get("state") for c in r["candidates"])
    others = ", ".join(f"{states[k]} {word}" for k, word in (("usable", "more usable"), ("rejected", "refused"))
                       if states[k])
    if not res:
        return [f"Toolkits: {plural(len(r['candidates']), 'candidate')} found, none fits" if r["candidates"]
                else "Toolkits: none found"]
    ch = res["choice"]["toolkit"]
    lines = [f"Toolkit: nvcc {ch['nvcc_full']} at {ch['root']} (found via {', '.join(ch['sources'])})"
             + (f"; {others}" if others else "")]
    if res["cuda_home"]["is_view"]:
        lines.append(f"  CUDA_HOME for FlashInfer: a view of it adding {', '.join(res['cuda_home']['added'])}")
    return lines + [f"  refused: nvcc {c.get('nvcc_full') or '?'} at {shown(c['root'], 200)} "
                    f"({', '.join(c['sources'])}): {(c.get('why') or '?')[:200]}"
                    for c in r["candidates"] if c.get("state") == "rejected"]


def _with(r: dict, d) -> str:
    a = r.get("after") or {}
    st = a.get("status") or {}
    if r.get("import_refused"):
        return "With flashinfer-sm120: FlashInfer not imported (the first line says why)"
    if st.get("mode") == "guard":
        return "With flashinfer-sm120: guard (FlashInfer imports; its JIT builds raise the fix above)"
    if "error" in a:
        return f"With flashinfer-sm120: {st.get('mode')}; FlashInfer's import failed"
    if not d.targets:  # FlashInfer names the JIT dir after the targets (.../0.7.4/120f/...): none yet
        return f"With flashinfer-sm120: {st.get('mode')}; no JIT dir: it is named after the targets, and there are none"
    return f"With flashinfer-sm120: {st.get('mode')}; JIT dir {a.get('jit_dir')}"


def _facts(r: dict, d) -> list[str]:
    """The facts of the default screen, each one sentence."""
    groups = collections.Counter((g["name"], g["capability"]) for g in r["gpus"])
    facts = [_versions(r), "GPUs: " + ", ".join(f"{n} x {name} ({cap})" for (name, cap), n in groups.items())
             if groups else f"GPUs: none visible (read from {r['gpu_source']})"]
    facts += [f"Targets: {', '.join(d.targets)} ({_targets_from(r)})"] if d.targets else []
    alone = {None: "", True: "would work, ", False: "would fail because "}[d.alone.works] + d.alone.why
    auto = (r.get("autoload") or {}).get("pth")
    facts += _toolkit(r) + [f"FlashInfer alone: {alone}", _with(r, d)]
    facts.append(f"Autoload: enabled ({', '.join(auto)})" if auto
                 else "Autoload: not enabled ('flashinfer-sm120 enable' patches every vLLM/SGLang process)")
    ninja = (r.get("ninja") or {}).get("chosen")
    if ninja:
        facts.append(f"Ninja: {ninja['path']} (ninja {ninja['version']})")
    servers = (r.get("servers") or {}).get("servers")
    if servers is not None:
        facts.append("Servers: " + (", ".join(s["label"] for s in servers) or "neither vLLM nor SGLang installed"))
    return facts


def add_parser(sub) -> None:
    """Register the ``doctor`` subcommand on an argparse subparsers object."""
    codes = "; ".join(f"{k}: {v}" for k, v in EXIT_CODES.items())
    d = sub.add_parser("doctor", help="a verdict (OK or PROBLEM with the fix), then what was found and chosen",
                       description="Check that FlashInfer's JIT builds will work here: the first line is OK or "
                       "PROBLEM with the fix, then one screen on the GPUs, targets, toolkit, FlashInfer with "
                       f"and without flashinfer-sm120, the autoload and ninja. Exit status {codes}.")
    d.add_argument("--json", action="store_true", help="print the whole report as JSON on stdout")
    d.add_argument("--verbose", "-v", action="store_true",
                   help="print every toolkit, patch step, exported variable and server")
    d.add_argument("--arch", help=ARCH_HELP)
    d.add_argument("--timeout", type=cli_float("--timeout", 0.1, 3600.0), metavar="SECONDS",
                   help="how long unpatched FlashInfer may take in its child process (it runs nvcc without a "
                        f"timeout; default {ALONE_TIMEOUT_S:g})")
    d.set_defaults(func=run_doctor)
