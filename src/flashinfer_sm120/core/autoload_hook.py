"""Start-up hook of the flashinfer-sm120 autoload (standard library only), copied unchanged by ``enable`` next to
its ``.pth`` as the module ``flashinfer_sm120_autoload``.  :func:`install` puts one finder first on
``sys.meta_path``; the first import of a trigger (``flashinfer``, ``vllm``, ``sglang``) makes it leave and import
``flashinfer_sm120``.  It never stops an interpreter: a missing or failing package is one line naming the fix.
"""

import os
import sys

#: The ``.pth`` file ``enable`` writes next to this module, and its one line.
PTH_NAME = "flashinfer_sm120_autoload.pth"
#: This module's name in site-packages (the ``.pth`` imports it), and its file.
MODULE_NAME = "flashinfer_sm120_autoload"
HOOK_FILE = MODULE_NAME + ".py"
PTH_LINE = f"import {MODULE_NAME}; {MODULE_NAME}.install()\n"
#: Top-level modules whose first import loads flashinfer_sm120.
TRIGGERS = ("flashinfer", "vllm", "sglang")
#: Values of FLASHINFER_SM120_DISABLE that mean "enabled".
_OFF = ("", "0", "false", "no", "off")


class FlashInferSm120Autoload:
    """Loads flashinfer_sm120 at the first import of a trigger module, then leaves sys.meta_path."""

    def __init__(self, triggers, pth):
        self.triggers = frozenset(triggers)
        self.pth = pth
        self.armed = True

    def find_spec(self, name, path=None, target=None):
        if not self.armed or name.partition(".")[0] not in self.triggers:
            return None
        self.armed = False
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        try:
            import flashinfer_sm120.core.autoload

            flashinfer_sm120.core.autoload.triggered(name, self.pth)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            self.say(exc)
        done = sys.modules.get(name)
        if done is not None:  # flashinfer_sm120 imported the trigger itself (wrapt, filelock, packaging):
            # hand that module over; never execute it twice.  threat-model: P1 (correct, not guessed)
            return _already_loaded(name, done)
        # We left sys.meta_path while the import system was walking it: ask the
        # remaining finders ourselves so that none is skipped.
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if find is not None:
                spec = find(name, path, target)
                if spec is not None:
                    return spec
        return None

    def say(self, exc):
        """One line naming the fix (P1: an unpatched server must not fail later unexplained)."""
        try:
            sys.stderr.write("flashinfer-sm120: autoload failed (%r); FlashInfer is not patched. Fix: reinstall it "
                             "from its checkout (pip install --force-reinstall /path/to/its/checkout; it is not on "
                             "PyPI), or remove %s (FLASHINFER_SM120_DISABLE=1 silences this)\n" % (exc, self.pth))
        except BaseException:
            pass


class _Loaded:
    """Loader of a module that is already in ``sys.modules``: the import returns it unchanged."""

    def __init__(self, module):
        self.module = module
        self.spec = getattr(module, "__spec__", None)

    def create_module(self, spec):
        return self.module

    def exec_module(self, module):
        if self.spec is not None:  # the import system set __spec__ to ours: put its own back
            module.__spec__ = self.spec


def _already_loaded(name, module):
    """A spec whose import yields ``module`` as it is (runs nothing).  The import system prefers
    the ``__spec__`` of a module already in ``sys.modules`` to the one a finder returns (and would
    execute it again), so ours stands in as ``__spec__`` until :meth:`_Loaded.exec_module` puts the
    module's own back."""
    loader = _Loaded(module)
    spec = type(sys.__spec__)(  # importlib.machinery.ModuleSpec, without importing anything
        name, loader, is_package=getattr(loader.spec, "submodule_search_locations", None) is not None)
    try:
        module.__spec__ = spec
    except AttributeError:
        pass
    return spec


def triggers(env):
    """FLASHINFER_SM120_AUTOLOAD_TRIGGERS's modules (comma or space separated; a submodule stands for its top-level
    module, as imports are matched), else :data:`TRIGGERS`: also when it is set but blank."""
    names = env.get("FLASHINFER_SM120_AUTOLOAD_TRIGGERS", "").replace(",", " ").split()
    return tuple(dict.fromkeys(n.partition(".")[0] for n in names if n.partition(".")[0])) or TRIGGERS


def install():
    """Put the finder in place, once per process; never raises (but KeyboardInterrupt)."""
    try:
        env = os.environ
        if env.get("FLASHINFER_SM120_DISABLE", "").strip().lower() not in _OFF:
            return
        # One finder, even when site reads the .pth twice (a venv's lib64 -> lib link)
        # or finds copies in several site directories.
        if any(type(f).__name__ == "FlashInferSm120Autoload" for f in sys.meta_path):
            return
        pth = os.path.join(os.path.dirname(os.path.abspath(__file__)), PTH_NAME)
        sys.meta_path.insert(0, FlashInferSm120Autoload(triggers(env), pth))
    except KeyboardInterrupt:
        raise
    except BaseException:
        pass
