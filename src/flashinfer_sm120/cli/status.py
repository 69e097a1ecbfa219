"""``flashinfer-sm120 status``: one line, the mode, the toolkit and the targets; from the last record (no torch or
FlashInfer import) while it holds (:func:`recorded`, else what changed, P8), else by importing FlashInfer (seconds)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import fields

from flashinfer_sm120.cli.common import ARCH_HELP, apply_arch
from flashinfer_sm120.core.toolkit.model import Setting
from flashinfer_sm120.safety.formats.base import printable

#: Exit status -> meaning (printed in ``status --help`` and docs/cli.md).
EXIT_CODES = {
    0: "FlashInfer builds with a toolkit that fits, for at least one target (patched or noop)",
    1: "it cannot build anything: no toolkit fits (guard), patching or FlashInfer's import failed, "
       "no targets, FlashInfer not installed, flashinfer-sm120 disabled, or every JIT build would be refused: "
       "FlashInfer's JIT cache in a directory another user controls or on a path ninja misreads, or a program "
       "every build runs, or the temporary directory, failing the trust rule (refused)",
    2: "bad usage (an unknown option, a bad --arch)",
}
_OK = ("patched", "noop")


def exit_code(st: dict) -> int:
    """0 when FlashInfer can build for at least one target with a toolkit that fits, else 1."""
    return 0 if st.get("mode") in _OK and st.get("toolkit") and st.get("targets") else 1


def status_line(st: dict) -> str:
    """``<mode>: nvcc <release> at <toolkit>; targets <sm_...>``, or why there is no toolkit; then each toolkit
    setting not used as given, with its fix (P8)."""
    return "; ".join([_line(st), *(str(Setting(**s)) for s in st.get("settings", ()))])


def _line(st: dict) -> str:
    mode, tk = st.get("mode"), st.get("toolkit")
    if mode in _OK and tk:
        targets = ", ".join(st.get("targets") or []) or f"none, nothing can be built ({_no_targets(st)})"
        return f"{mode}: nvcc {tk.get('nvcc_full')} at {tk.get('root')}; targets {targets}"
    if mode == "guard":
        return ("guard: no CUDA toolkit fits, FlashInfer's JIT builds will raise the fix "
                "('flashinfer-sm120 doctor' shows what was found)")
    if mode == "disabled":
        return "disabled: FLASHINFER_SM120_DISABLE is set; FlashInfer uses its own toolkit choice"
    return f"{mode}: {st.get('error') or 'see flashinfer-sm120 doctor'}"


def _no_targets(st: dict) -> str:
    """Why there are no targets: a bad arch list, or no GPU and no list (with the fix)."""
    from flashinfer_sm120.diagnose.verify.diagnosis import NO_TARGETS, NO_TARGETS_FIX

    return st.get("arch_list_error") or f"{NO_TARGETS}; fix: {NO_TARGETS_FIX}"


def run_status(args: argparse.Namespace) -> int:
    apply_arch(args.arch)  # a bad value: UsageError, printed by cli.main (as JSON too with --json)
    os.environ.setdefault("FLASHINFER_SM120_QUIET", "1")  # the line below says it
    from flashinfer_sm120.core.facts.refusals import builds_refused, import_refused
    from flashinfer_sm120.core.facts.workspace import workspace_path

    # threat-model: P4: FlashInfer's import would write where it must not, or every JIT build would be refused
    refused = import_refused() or ((why := builds_refused(workspace_path()[0])) and "FlashInfer was not imported: "
                                   f"every JIT build here would be refused: {why}")
    if refused:
        return _say(args, {"mode": "refused", "toolkit": None, "targets": [], "error": str(refused)}, "check")
    if args.fresh:  # the import below resolves again instead of replaying the record (laststatus.replay)
        from flashinfer_sm120.core.patch.state import STATE

        STATE.resolved = True
    else:
        got, why_not = recorded()
        if got is not None:
            return _say(args, dict(got), "record")
        print(f"flashinfer-sm120: importing FlashInfer to answer (a few seconds): no usable record "
              f"({why_not})", file=sys.stderr)
    return _full(args)


def _full(args: argparse.Namespace) -> int:
    """Import FlashInfer with the patch and ask :func:`flashinfer_sm120.status` (recorded for the next call)."""
    import flashinfer_sm120 as shim

    try:
        import flashinfer.jit.core  # noqa: F401  (patching happens on this import)
    except Exception as exc:  # FlashInfer's own import failed: say why, and what we did before it
        from flashinfer_sm120.core.facts.refusals import import_failure
        from flashinfer_sm120.core.facts.reinstall import DEPENDENCIES

        top = (getattr(exc, "name", None) or "").partition(".")[0] if isinstance(exc, ModuleNotFoundError) else ""
        if top == "flashinfer":
            return _say(args, {"mode": "not installed", "error": f"FlashInfer is not installed for {sys.executable}: "
                               f"pip install flashinfer-python"}, "import")
        if top in DEPENDENCIES:  # ours: the CLI names the fix; one of FlashInfer's (torch, numpy) is a status
            raise
        full = dict(shim.status())
        full["mode"], full["error"] = "failed", import_failure(exc, full)
    else:
        full = shim.status()
    from flashinfer_sm120.core.patch import record_status
    from flashinfer_sm120.core.patch.laststatus import from_status

    record_status(full)  # type: ignore[arg-type]
    return _say(args, dict(from_status(full)), "import", full)


def _say(args: argparse.Namespace, st: dict, source: str, full: dict | None = None) -> int:
    """Print ``st`` as one line, or as JSON with ``--json``; the exit status (:data:`EXIT_CODES`)."""
    if args.json:
        out = {"targets": st.get("targets"), **(full or st), "source": source}
        tk = out.get("toolkit", st.get("toolkit"))  # without the record's fingerprint of nvcc ("stat")
        out["toolkit"] = {k: v for k, v in tk.items() if k != "stat"} if isinstance(tk, dict) else tk
        out["ok"] = exit_code(st) == 0  # threat-model: P8: the document says what the exit status says
        if not out["ok"] and not out.get("error") and st.get("toolkit"):
            out["error"] = f"no targets, so nothing can be built: {_no_targets(st)}"
        print(json.dumps(out, indent=2, default=str))
    else:
        print(printable(status_line(st)))  # threat-model: P8: a record file's text is shown, never acted on
    return exit_code(st)


def add_parser(sub) -> None:
    """Register ``status``."""
    codes = "; ".join(f"{k}: {v}" for k, v in EXIT_CODES.items())
    s = sub.add_parser("status", help="one line: mode, toolkit and targets; exit 1 when nothing can be built",
                       description="Print one line: the mode, the nvcc FlashInfer builds with, and the targets. "
                       "Read from what the last run under the same settings recorded (no torch or FlashInfer "
                       "import) when nothing it depends on changed, else by importing FlashInfer with "
                       f"flashinfer-sm120 (it says so on stderr). Exit status {codes}.")
    s.add_argument("--json", action="store_true",
                   help="print JSON: mode, error, toolkit, targets and source (record or import); with "
                        "source import, flashinfer_sm120.status() too")
    s.add_argument("--arch", help=ARCH_HELP)
    s.add_argument("--fresh", action="store_true", help="ignore the record: import FlashInfer and resolve again")
    s.set_defaults(func=run_status, json_failure=_usage_failure)


def _usage_failure(message: str, kind: str, fix: str) -> dict:
    """``status --json`` for a refused command line: the fields of its other refusals (mode ``failed``)."""
    return {"mode": "failed", "toolkit": None, "targets": [], "error": f"{message}; Fix: {fix}" if fix else message,
            "source": kind, "ok": False}


def recorded() -> tuple[dict | None, str | None]:
    """``(status, None)`` from the last record when it still holds for this process's inputs, else ``(None, why not)``."""
    from flashinfer_sm120.core.patch import laststatus

    records, problem = laststatus.load()
    records = [r for r in records if _well_formed(r.get("status"))]
    if problem or not records:
        return None, problem or f"{laststatus.path()} holds no record of this release's shape"
    now = laststatus.inputs()
    match = next((r for r in records if r["inputs"] == now), None)
    if match is None:
        closest = min(records, key=lambda r: len(_changes(r["inputs"], now)))
        return None, "what the record was made from changed: " + "; ".join(_changes(closest["inputs"], now))
    if isinstance(match.get("recheck"), str):
        return None, match["recheck"]
    tk = match["status"].get("toolkit")
    from flashinfer_sm120.safety.ownership import fingerprint

    if tk and fingerprint(tk.get("nvcc", "")) != tk.get("stat"):
        return None, f"{tk.get('nvcc')} changed since it was recorded"
    return match["status"], None  # type: ignore[return-value]


def _well_formed(st) -> bool:
    """Whether a recorded :func:`~.laststatus.from_status` has its shape: a record of another shape is none (the file
    is S2 input)."""
    from flashinfer_sm120.core.patch.state import Mode

    if not isinstance(st, dict) or st.get("mode") not in [m.value for m in Mode]:
        return False
    tk, targets, settings = st.get("toolkit"), st.get("targets"), st.get("settings")
    if tk is not None and not (isinstance(tk, dict) and isinstance(tk.get("nvcc"), str)
                               and isinstance(tk.get("stat"), list)):
        return False
    texts = [st.get(k) for k in ("error", "arch_list_error", "flashinfer")] + [(tk or {}).get(k) for k in
                                                                              ("nvcc_full", "root")]
    rows = [list(s.values()) if isinstance(s, dict) and list(s) == [f.name for f in fields(Setting)] else None
            for s in settings] if isinstance(settings, list) else [None]  # each Setting's fields, in order
    return all(isinstance(x, list) and all(isinstance(v, str) for v in x) for x in (targets, *rows)) and all(
        v is None or isinstance(v, str) for v in texts)


def _changes(old: dict, new: dict) -> list[str]:
    """What differs between two :func:`~.laststatus.inputs`, each in words a user can act on (P8)."""
    from flashinfer_sm120.core.patch import laststatus
    from flashinfer_sm120.safety.formats.base import MAX_WORD, shown as _shown

    def shown(value) -> str:  # paths whole, as people copy them; still bounded
        return "unset" if value is None else _shown(value, limit=MAX_WORD)

    def differ(key: str) -> list[str]:
        was = old.get(key) or {}
        return sorted(k for k in set(was) | set(new[key]) if was.get(k) != new[key].get(k))

    env = dict(os.environ)
    out = [f"{var} changed from {shown((old.get('env') or {}).get(var))} to {shown(new['env'].get(var))}"
           for var in differ("env")]
    for place in differ("nvcc"):
        where = laststatus.which_nvcc(env) if place == "PATH" else env.get(place, "")
        if place in ("CUDA_HOME", "CUDA_PATH") and where:
            where = os.path.join(where, "bin", "nvcc")
        out.append(f"the nvcc found through {place} ({shown(where or 'none now')}) was replaced, added or removed")
    dirs = differ("mtimes")
    if dirs:
        out.append(f"{shown(dirs[0])} changed (a package installed or removed)"
                   + (f", and {len(dirs) - 1} more directories" if len(dirs) > 1 else ""))
    words = {"python": lambda: f"another Python ({shown(new['python'][0])})",
             "version": lambda: f"flashinfer-sm120 is now {new['version']} (was {shown(old.get('version'))})",
             "other_env": lambda: "an environment variable not named above changed (values are not recorded)",
             "usr_local_cuda": lambda: f"/usr/local/cuda now points to {shown(new['usr_local_cuda'])} "
                                       f"(was {shown(old.get('usr_local_cuda'))})",
             "gpus": lambda: "the GPUs the driver lists changed"}
    return out + [say() for key, say in words.items() if old.get(key) != new.get(key)]
