"""The ``.pth`` autoload: load flashinfer_sm120 only when a module that needs it is imported.

``flashinfer-sm120 enable`` writes :data:`PTH_NAME` into a site-packages
directory.  ``site.py`` executes a ``.pth`` line that starts with ``import`` at
every interpreter start (Python docs, "site — Site-specific configuration hook"),
so that line must cost nothing and break nothing.  It runs :data:`HOOK_SOURCE`,
which uses the standard library only and imports nothing (``os`` and ``sys`` are
already loaded by ``site``): it puts one finder at the front of ``sys.meta_path``
(PEP 451 ``find_spec`` protocol).  On the first import of a module in
:data:`TRIGGERS` (or a submodule of one), the finder disarms and removes itself,
imports ``flashinfer_sm120`` (which registers the FlashInfer patch hooks), calls
:func:`triggered`, and hands the import on to the remaining finders.  Any other
import pays one ``str.partition`` and a set lookup; pip, linters and every tool
that never touches FlashInfer never load the package, wrapt, logging or asyncio.

Failure rules of the hook (it must never stop an interpreter):

* the package is gone (``pip uninstall`` leaves the ``.pth``): silent;
* the package raises anything at import, ``SystemExit`` included: one line on
  stderr naming the ``.pth`` to remove, and the import of the trigger goes on;
* ``FLASHINFER_SM120_DISABLE=1`` at start-up: no finder is installed at all.

Triggers (decided here, documented in the README):

``flashinfer``
    the module being patched.
``vllm``, ``sglang``
    servers that look for nvcc and ninja *before* they import FlashInfer (vLLM
    0.33 ``vllm/utils/flashinfer.py`` ``has_flashinfer()``: nvcc and ``which
    ninja``; SGLang 0.5.23's own JIT: ``cuda_home()``, ``_jit_cuda_version()``;
    see :mod:`flashinfer_sm120.servers`).
    For these, once the server package itself has been imported, the chosen
    toolkit is resolved and exported (``CUDA_HOME``, ``PATH`` with nvcc and ninja; see
    :mod:`flashinfer_sm120.environ`) without importing FlashInfer, which would
    initialise CUDA in the server's parent process.

``FLASHINFER_SM120_AUTOLOAD_TRIGGERS`` (comma or space separated top-level
module names) replaces the default triggers at start-up.
"""

from __future__ import annotations

import logging
import os
import sys

__all__ = ["PTH_NAME", "TRIGGERS", "EXPORT_EARLY", "HOOK_SOURCE", "pth_line", "triggered", "worker_setup", "state", "enabled_in",
           "doctor_report", "doctor_lines"]

logger = logging.getLogger("flashinfer_sm120")

#: File name of the ``.pth``; unchanged since 0.1.0 so ``disable`` removes old ones too.
PTH_NAME = "flashinfer_sm120_autoload.pth"

#: Top-level modules whose first import loads flashinfer_sm120.
TRIGGERS = ("flashinfer", "vllm", "sglang")

#: Triggers after whose import the chosen toolkit is exported at once (see module docstring).
EXPORT_EARLY = ("vllm", "sglang")

# The hook, run by the .pth line with ``_pth`` (this file's path) and ``_triggers``
# in its globals.  Standard library only, nothing imported at start-up.
HOOK_SOURCE = r'''
def _boot():
    import os, sys
    env = os.environ
    if env.get("FLASHINFER_SM120_DISABLE", "").strip().lower() not in ("", "0", "false", "no", "off"):
        return
    names = env.get("FLASHINFER_SM120_AUTOLOAD_TRIGGERS")
    triggers = frozenset(names.replace(",", " ").split() if names is not None else _triggers)
    pth = _pth

    def say(exc):
        try:
            sys.stderr.write("flashinfer-sm120: autoload failed (%r); FlashInfer is not patched. Fix: "
                             "pip install --force-reinstall flashinfer-sm120, or remove %s\n" % (exc, pth))
        except BaseException:
            pass

    class FlashInferSm120Autoload:
        """Loads flashinfer_sm120 at the first import of a trigger module, then leaves sys.meta_path."""

        armed = True

        def find_spec(self, name, path=None, target=None):
            if not self.armed or name.partition(".")[0] not in triggers:
                return None
            self.armed = False
            try:
                sys.meta_path.remove(self)
            except ValueError:
                pass
            try:
                import flashinfer_sm120.autoload as _a
                _a.triggered(name, pth)
            except KeyboardInterrupt:
                raise
            except ModuleNotFoundError as exc:
                if exc.name not in ("flashinfer_sm120", "flashinfer_sm120.autoload"):
                    say(exc)
            except BaseException as exc:
                say(exc)
            # We left sys.meta_path while the import system was walking it: ask the
            # remaining finders ourselves so none is skipped.
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if find is not None:
                    spec = find(name, path, target)
                    if spec is not None:
                        return spec
            return None

    # One finder per process, even when site reads this file twice (a venv's lib64 -> lib
    # symlink) or finds copies in several site directories.
    if not any(type(f).__name__ == "FlashInferSm120Autoload" for f in sys.meta_path):
        sys.meta_path.insert(0, FlashInferSm120Autoload())


try:
    _boot()
except KeyboardInterrupt:
    raise
except BaseException:
    pass
'''


def pth_line(triggers: tuple[str, ...] = TRIGGERS) -> str:
    """The one line written into the ``.pth`` file (ends with a newline).

    ``site.addpackage`` ``exec``s it in its own frame, where ``fullname`` is the
    ``.pth`` path; the hook gets that path (for its one error line) and the
    triggers in a fresh globals dict, so nothing leaks into ``site``.  Start-up
    cost is kept to a few tens of microseconds: the line carries the hook
    compiled by the writing interpreter (``marshal``, used when the reader's
    bytecode magic number is the same, as for ``.pyc`` files; else the source is
    compiled), and does nothing when a hook is already installed (a venv's
    site-packages is read twice, through ``lib`` and the ``lib64`` symlink).
    """
    import importlib.util
    import marshal

    code = compile(HOOK_SOURCE, "<" + PTH_NAME + ">", "exec", optimize=2)  # no docstrings
    return ("import sys, marshal; any(type(f).__name__ == 'FlashInferSm120Autoload' for f in sys.meta_path) "
            "or exec(marshal.loads(bytes.fromhex('%s')) if getattr(sys.modules.get('_frozen_importlib_external'), "
            "'MAGIC_NUMBER', b'').hex() == '%s' else %r, {'__name__': 'flashinfer_sm120_autoload', "
            "'_pth': locals().get('fullname'), '_triggers': %r})\n"
            % (marshal.dumps(code).hex(), importlib.util.MAGIC_NUMBER.hex(), HOOK_SOURCE, tuple(triggers)))


#: Values of a boolean environment variable that mean "off" (as everywhere in this package).
_OFF = ("", "0", "false", "no", "off")


class _State:
    triggered_by: str | None = None
    pth: str | None = None
    early_export: str | None = None  # what happened to the early export, for doctor


state = _State()


def triggered(name: str, pth: str | None = None) -> None:
    """Called by the hook once ``flashinfer_sm120`` is imported; never raises.

    Records which import loaded the package (for ``doctor``) and, for the server
    triggers in :data:`EXPORT_EARLY`, registers a post-import hook that exports
    the chosen toolkit as soon as the server package has finished importing.

    Args:
        name: the module whose import fired the hook, e.g. ``"vllm.entrypoints"``.
        pth: path of the ``.pth`` file that installed the hook, if known.
    """
    state.triggered_by, state.pth = name, pth
    top = name.partition(".")[0]
    if top not in EXPORT_EARLY:
        return
    try:
        import wrapt

        wrapt.register_post_import_hook(_export_early, top)
    except Exception as exc:  # wrapt missing or broken: FlashInfer's own hooks report it
        state.early_export = f"not done: {exc!r}"


def _export_early(module) -> None:
    """Post-import hook of a server package: resolve and export, without FlashInfer."""
    _export_now(f"after importing {getattr(module, '__name__', module)}")


def _export_now(why: str) -> None:
    try:
        from . import environ, resolve

        if os.environ.get("FLASHINFER_SM120_DISABLE", "").strip().lower() not in _OFF:
            state.early_export = "not done: FLASHINFER_SM120_DISABLE is set"
            return
        res = resolve()
        home = res.home.path
        environ.export(home, os.path.join(home, "bin", "nvcc"), res.choice.targets)
        state.early_export = f"exported {home} {why}"
    except Exception as exc:  # FlashInfer's import reports the same problem with its fix
        state.early_export = f"not done: {exc}"
        logger.debug("flashinfer-sm120: early export (%s) skipped: %r", why, exc)


def worker_setup() -> None:
    """Per-worker set-up hook for process managers (Ray ``worker_process_setup_hook``).

    Does in a worker what the ``.pth`` does for ``import vllm``: the FlashInfer
    patch hooks are installed (FlashInfer imported before or after is patched)
    and the chosen toolkit is exported now (``CUDA_HOME``, ``PATH``...), without
    importing FlashInfer.  Never raises; ``doctor``/``status()`` report problems.

    Use as ``runtime_env={"worker_process_setup_hook":
    "flashinfer_sm120.autoload.worker_setup"}`` (see ``examples/ray_workers.py``).
    """
    from . import install

    state.triggered_by = state.triggered_by or "worker_setup"
    try:
        install()
    except Exception as exc:  # install() already guards
        logger.error("flashinfer-sm120: install failed: %r", exc)
    if "flashinfer" not in sys.modules:  # once patched, the patch layer has exported already
        _export_now("by worker_setup")


def enabled_in() -> list[str]:
    """The ``.pth`` files of this interpreter's site directories (what ``site`` reads at
    start-up: ``site.getsitepackages()``, and the user site when enabled)."""
    import site

    dirs = list(getattr(site, "getsitepackages", lambda: [])())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    seen, out = set(), []
    for d in dirs:
        path = os.path.join(d, PTH_NAME)
        if os.path.realpath(path) not in seen and os.path.isfile(path):
            seen.add(os.path.realpath(path))
            out.append(path)
    return out


def doctor_report() -> dict:
    """The autoload part of ``doctor --json``: ``pth`` (files found), ``triggers``,
    ``disabled``, ``triggered_by`` and ``early_export`` (this process)."""
    return {"pth": enabled_in(), "triggers": list(TRIGGERS),
            "disabled": os.environ.get("FLASHINFER_SM120_DISABLE", "").strip().lower() not in _OFF,
            "triggered_by": state.triggered_by, "early_export": state.early_export}


def doctor_lines(report: dict | None, python: str) -> list[str]:
    """:func:`doctor_report` as ``doctor`` prints it."""
    report = report or {}
    if report.get("pth"):
        return [f"Autoload: {', '.join(report['pth'])}: every process of {python} is patched when it first "
                f"imports {', '.join(report['triggers'])}"
                + (" (but FLASHINFER_SM120_DISABLE is set)" if report.get("disabled") else "")]
    return [f"Autoload: not enabled for {python} ('flashinfer-sm120 enable' to patch every worker)"]
