"""``doctor``'s conclusions as data, judged from :func:`.report.collect`'s report: a verdict, what FlashInfer alone
would do, findings (branch on :class:`Level` and ``code``, never text); each check is one entry of :data:`CHECKS`."""

from __future__ import annotations

import enum
import os
from dataclasses import asdict, dataclass
from typing import Callable, Iterable

from flashinfer_sm120.core.autoload_hook import HOOK_FILE
from flashinfer_sm120.core.toolkit.model import Setting
from flashinfer_sm120.core.view.meta import lacks
from flashinfer_sm120.safety.formats.base import plural, shown

#: The code of a toolkit setting not used as given (a malformed or refused CUDA_HOME, CUDA_PATH, FLASHINFER_NVCC).
SETTING = "toolkit-setting"

#: The codes of the findings an OK verdict line names after "; but": a toolkit setting not used as given, servers
#: of this environment left to FlashInfer's failing choice, and a report on another environment than the activated one.
VERDICT_NOTES = (SETTING, "autoload-off", "autoload-triggers", "other-env")

#: Why nothing can be built with neither a GPU nor an arch list, and its fix (doctor and status say it).
NO_TARGETS = "no GPU visible and no FLASHINFER_CUDA_ARCH_LIST"
NO_TARGETS_FIX = ("FLASHINFER_CUDA_ARCH_LIST=12.0 for a server, build --arch 12.0 for an image (12.1 on DGX Spark); "
                  "check with flashinfer-sm120 doctor --arch 12.0")


class Level(str, enum.Enum):
    """How much a finding matters: a PROBLEM means FlashInfer's JIT builds will fail."""

    PROBLEM = "problem"
    WARNING = "warning"
    NOTE = "note"


@dataclass(frozen=True)
class Finding:
    """One thing ``doctor`` found: ``code`` for scripts, ``text`` one sentence without its period, ``fix``."""

    level: Level
    code: str
    text: str
    fix: str | None = None


@dataclass(frozen=True)
class Alone:
    """What unpatched FlashInfer would do here: ``works`` is ``None`` when it was not checked."""

    works: bool | None
    why: str


@dataclass(frozen=True)
class Diagnosis:
    """The verdict: ``ok`` when no finding is a problem; what is built with which nvcc."""

    findings: tuple[Finding, ...]
    alone: Alone
    targets: tuple[str, ...] = ()
    nvcc: str | None = None
    root: str | None = None

    @property
    def problems(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.level is Level.PROBLEM)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        """JSON-ready form (a level is its string: :class:`Level` is a ``str``)."""
        return dict(asdict(self), ok=self.ok)


def _choice(report: dict) -> dict:
    return ((report.get("resolution") or {}).get("choice")) or {}


def _check_installed(report: dict) -> Iterable[Finding]:
    """FlashInfer not imported on purpose (``sudo -E``, a temporary directory not ours; P4), not installed, too old."""
    if refused := report.get("import_refused"):  # threat-model: P4
        yield Finding(Level.PROBLEM, refused["code"], f"FlashInfer was not imported: {refused['text']}", refused["fix"])
    if not report.get("flashinfer_installed"):
        yield Finding(Level.PROBLEM, "flashinfer-missing", f"FlashInfer is not installed for {report.get('python')}",
                      "pip install flashinfer-python")
    elif not (report.get("release") or {}).get("supported", True):
        yield Finding(Level.PROBLEM, "release-unsupported", str(report["release"].get("reason")))


def _check_choice(report: dict) -> Iterable[Finding]:
    """No toolkit fits (the guard), the choice failed, no targets or a bad arch list, no curand.h, a mixed install."""
    res = report.get("resolution")  # absent when the guard is on or the choice raised
    if report.get("guard"):
        yield Finding(Level.PROBLEM, "guard", "no CUDA toolkit found here can build for these targets; FlashInfer's "
                      "JIT builds will raise the full message (doctor --verbose shows it)", report.get("fix"))
    elif res is None and report.get("resolution_error"):
        yield Finding(Level.PROBLEM, "resolution-failed", str(report["resolution_error"]))
    elif res is not None and not _choice(report).get("targets"):
        why = res.get("arch_list_error") or NO_TARGETS
        yield Finding(Level.PROBLEM, "no-targets", f"no targets: {why}, so nothing can be built",
                      NO_TARGETS_FIX)
    elif res is not None and res.get("arch_list_error"):
        yield Finding(Level.WARNING, "arch-list", res["arch_list_error"])
    if res is not None and not (res.get("cuda_home") or {}).get("curand_include"):
        yield Finding(Level.WARNING, "no-curand", "no curand.h in the chosen toolkit: sampling kernels will not "
                      "compile", "pip install 'nvidia-curand' matching the toolkit, or a full CUDA toolkit")
    for s in report.get("settings") or ():  # not used as given, worked around: the OK line names it too
        yield Finding(Level.WARNING, SETTING, str(Setting(**s)))
    for c in report.get("candidates") or ():  # a version file that disagrees with nvcc: nvcc's answer is used (P1)
        d = c.get("disagreement")
        if d:
            yield Finding(Level.WARNING, "version-disagreement", f"{c.get('root')}: {d['file']} says CUDA "
                          f"{d['file_version']}, but {d['nvcc']} --version says {d['nvcc_version']} (the nvcc's "
                          f"version is the one used)", "reinstall that toolkit as one set (its files come from "
                          "different releases), or remove the stale version file")


def _check_after(report: dict) -> Iterable[Finding]:
    after = report.get("after") or {}
    st = after.get("status") or {}
    if report.get("disabled"):
        yield Finding(Level.WARNING, "disabled", "FLASHINFER_SM120_DISABLE is set: nothing is patched; this report "
                      "says what flashinfer-sm120 would do", "unset FLASHINFER_SM120_DISABLE")
    elif report.get("import_refused"):
        return  # not imported on purpose (_check_installed)
    elif report.get("flashinfer_installed") and "error" in after and st.get("mode") != "guard":
        yield Finding(Level.PROBLEM, "import-failed", f"with flashinfer-sm120, {after['error']}")
    elif st.get("mode") == "failed" and st.get("error") and not report.get("guard"):
        yield Finding(Level.PROBLEM, "patch-failed", str(st["error"]))


def _check_sections(report: dict) -> Iterable[Finding]:
    host = (report.get("after") or {}).get("host_program")
    if host:
        yield Finding(Level.PROBLEM, "untrusted-host-program", f"{host['what']} {host['path']} "
                      f"fails the trust rule: {host['why']}; every JIT build is refused", host["fix"])
    elif refused := (report.get("after") or {}).get("builds_refused"):  # the JIT directory, TMPDIR
        yield Finding(Level.PROBLEM, "builds-refused", f"every JIT build is refused before nvcc runs: {refused}")
    ninja = report.get("ninja") or {}
    if "error" in ninja and "candidates" in ninja:
        yield Finding(Level.PROBLEM, "no-ninja", str(ninja["error"]))
    chosen = ninja.get("chosen") or {}
    auto = bool((report.get("autoload") or {}).get("pth"))  # the fix depends on it
    for n in ninja.get("conflicts") or ():  # two .ninja_log formats rebuild each other's modules
        log = f".ninja_log v{n['log_format']}" if n.get("log_format") else "another .ninja_log format"
        runs = (f"servers of this environment run {chosen['path']} (the autoload puts it first on PATH), a process "
                "without the autoload whichever is first on its PATH" if auto else
                "a server started from this environment runs whichever is first on its PATH")
        remove = "remove the other ninja (e.g. apt-get remove ninja-build)"
        yield Finding(Level.WARNING, "ninja-conflict", f"{n['path']} (ninja {n['version']}, {log}) is reachable too "
                      f"and rebuilds every module {chosen['path']} built, and the other way round; {runs}",
                      f"if one does, {remove} or put {os.path.dirname(chosen['path'])} first on its PATH" if auto
                      else f"'flashinfer-sm120 enable' (every server process then runs {chosen['path']}), or {remove}")
    stale = {k: v for k, v in (ninja.get("cache_log_formats") or {}).items() if str(k) != str(chosen.get("log_format"))}
    if stale and chosen.get("log_format"):
        yield Finding(Level.WARNING, "ninja-log-format", f"{plural(sum(stale.values()), 'module')} in "
                      f"{ninja.get('jit_dir')} were built by a ninja with .ninja_log v{', v'.join(sorted(stale))}: "
                      f"{chosen['path']} will rebuild them", f"'flashinfer-sm120 build' them again (it runs {chosen['path']})")
    applied = report.get("server_cache") or {}
    if applied.get("changed"):
        yield Finding(Level.NOTE, "server-cache", f"this report uses {applied['server']}'s FLASHINFER_WORKSPACE_BASE="
                      f"{applied['base']}, as importing it would ({applied['how']}); 'flashinfer-sm120 build' does the same")
    elif applied.get("error") or ("why" in applied and applied.get("server") is None):  # servers here differ
        yield Finding(Level.NOTE, "server-cache", f"this report uses FlashInfer's own JIT directory "
                      f"({applied.get('error') or applied['why']})", "'flashinfer-sm120 build --for vllm|sglang' picks one")
    for pth in (report.get("autoload") or {}).get("outdated") or ():
        yield Finding(Level.WARNING, "autoload-outdated", f"{pth} was not written by this release, or its module "
                      f"{HOOK_FILE} is missing", "run 'flashinfer-sm120 enable' again")
    names = (report.get("autoload") or {}).get("triggers") or ["flashinfer"]
    if auto and "flashinfer" not in names:  # a process that imports FlashInfer alone is left unpatched
        yield Finding(Level.WARNING, "autoload-triggers", f"FLASHINFER_SM120_AUTOLOAD_TRIGGERS names "
                      f"{', '.join(names)}, not flashinfer, so a process that imports FlashInfer without them is "
                      "not patched", "add flashinfer to FLASHINFER_SM120_AUTOLOAD_TRIGGERS (module names "
                      "separated by commas or spaces), or unset it")
    venv, prefix = report.get("virtual_env"), report.get("prefix")  # the activated venv is not the one checked
    if venv and prefix and os.path.realpath(venv) != os.path.realpath(prefix):
        bin_dir = os.path.join(venv, "bin")
        yield Finding(Level.WARNING, "other-env", f"this report is on the environment {prefix}, not on the activated "
                      f"VIRTUAL_ENV={venv}", f"run {os.path.join(bin_dir, 'flashinfer-sm120')} doctor, or "
                      f"{os.path.join(bin_dir, 'python')} -m flashinfer_sm120 doctor")
    off = not auto and not report.get("disabled") and not report.get("guard")
    if off and _choice(report).get("targets") and alone(report).works is False:
        yield Finding(Level.WARNING, "autoload-off", "the autoload is not enabled here, so a server that does not "
                      "import flashinfer_sm120 itself gets FlashInfer's own choice, which fails (FlashInfer alone, "
                      "below)", "flashinfer-sm120 enable")
    for key in ("ninja", "servers", "builds"):
        if "error" in (report.get(key) or {}) and not (key == "ninja" and "candidates" in report[key]):
            yield Finding(Level.NOTE, "section-error", f"{key} could not be checked ({report[key]['error']})")


def _check_build_line(report: dict) -> Iterable[Finding]:
    """The ``build_line`` section: variables set, modules warmed with other values, targets a server sets."""
    section = report.get("build_line") or {}
    for s in section.get("set") or ():
        value = s["value"] if len(s["value"]) <= 80 and s["value"].isprintable() else shown(s["value"], 80)
        yield Finding(Level.WARNING, "build-line-variable", f"{s['name']}={value} changes every "
                      f"build line ({s['enters']}; {s['where']}): the warm cache will be rebuilt",
                      f"unset {s['name']}, or warm the cache with it set (flashinfer-sm120 build)")
    stale = section.get("stale") or {}
    if stale:
        names = sorted({c["name"] for changed in stale.values() for c in changed})
        yield Finding(Level.WARNING, "build-line-stale", f"{plural(len(stale), 'built module was', 'built modules were')} "
                      f"built with other values of {', '.join(names)}: FlashInfer will rebuild "
                      f"{'it' if len(stale) == 1 else 'them'}", "set the variables as they were at the build, or "
                      "build again with these values (flashinfer-sm120 build; doctor --verbose lists them)")
    for a in section.get("server_arch") or ():
        if a.get("value"):
            yield Finding(Level.NOTE, "server-arch", f"{a['name']} will build for {', '.join(a['targets'])} (its "
                          f"{a['function']} sets {a['variable']}={a['value']})",
                          f"flashinfer-sm120 build --for {a['name'].lower()} warms that")


#: Every check, in order; each reads the report and yields findings.  Add one line to add a check.
CHECKS: list[Callable[[dict], Iterable[Finding]]] = [
    _check_installed,
    _check_choice,
    _check_after,
    _check_sections,
    _check_build_line,
]


def alone(report: dict) -> Alone:
    """Whether FlashInfer without flashinfer-sm120 would build here, and why (from the child's answer)."""
    b = report.get("before") or {}
    home, version = b.get("cuda_home"), b.get("cuda_version")
    targets = tuple(b.get("target_cuda_archs") or ())
    if "error" in b:
        if b.get("skipped"):
            return Alone(None, f"not checked: {b['skipped']}")
        return Alone(False, f"its own import or toolkit lookup failed ({b['error']})")
    if not home or not os.path.lexists(os.path.join(home, "bin", "nvcc")):
        # get_cuda_version() then asks torch (cpp_ext.py 0.7.x)
        cuda = (f"; its CUDA version would come from torch: {version}" if version
                else f"; {b['cuda_version_error']}" if b.get("cuda_version_error") else "")
        return Alone(False, f"it finds no nvcc (its CUDA_HOME is {home or 'unset'}{cuda})")
    if not targets:
        return Alone(False, f"it targets nothing ({NO_TARGETS})")
    uses = f"it would use {home} (nvcc {version})"
    real = os.path.realpath(home)
    for c in report.get("candidates") or ():
        if os.path.realpath(c.get("root") or "") == real and c.get("state") == "rejected":
            return Alone(False, f"{uses}: {c.get('why')}")
    if report.get("guard"):
        return Alone(False, f"{uses}, which cannot build for these targets")
    missing = lacks(home)
    if missing:
        return Alone(False, f"{uses}, which lacks {', '.join(missing)} (FlashInfer links -lcudart -lcuda from its "
                     f"lib64 and lib64/stubs; its sampling module includes curand.h)")
    ours = tuple(_choice(report).get("targets") or ())
    theirs = f" (flashinfer-sm120: {', '.join(ours)})" if ours and set(targets) != set(ours) else ""
    return Alone(True, f"with {home} (nvcc {version}), for {', '.join(targets)}{theirs}")


def diagnose(report: dict) -> Diagnosis:
    """Run :data:`CHECKS` on ``report``; a check that raises becomes a NOTE (the rest still run)."""
    found: list[Finding] = []
    for check in CHECKS:
        try:
            found.extend(check(report))
        except Exception as exc:
            found.append(Finding(Level.NOTE, "check-error", f"{check.__name__} raised {type(exc).__name__}: {exc}"))
    ch = _choice(report)
    tk = ch.get("toolkit") or {}
    return Diagnosis(tuple(found), alone(report), tuple(ch.get("targets") or ()), tk.get("nvcc_full"), tk.get("root"))
