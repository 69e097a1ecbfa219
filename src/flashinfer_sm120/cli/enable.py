"""``enable|disable``: the ``.pth`` autoload (:mod:`flashinfer_sm120.diagnose.autoload`); a file not ours, or ours
edited, is never overwritten or removed without ``--force`` (P5).  ``disable`` works with the rest of the package
broken: this module imports only ``core.autoload_hook``, ``diagnose.autoload``, ``errors`` and ``safety.fs.atomic``."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import glob
import hashlib
import os
import py_compile
import shlex
import site
import stat
import sys
import sysconfig

from flashinfer_sm120.core.autoload_hook import HOOK_FILE, MODULE_NAME, PTH_NAME, TRIGGERS
from flashinfer_sm120.diagnose.autoload import OURS_MAX, hook_source, other_lines, pth_files, read_text, site_dirs
from flashinfer_sm120.errors import PlaceError, Sm120Error, UsageError
from flashinfer_sm120.safety.fs.atomic import sweep, temp_prefix, write_atomic


def user_site_problem() -> str | None:
    """Why this interpreter does not read the user site-packages (a venv, PEP 405; ``python -s``), or ``None``."""
    if site.ENABLE_USER_SITE:
        return None
    why = (f"it runs in a virtual environment, {sys.prefix}" if sys.prefix != sys.base_prefix
           else "PYTHONNOUSERSITE is set" if os.environ.get("PYTHONNOUSERSITE")
           else "python -s, or a uid/euid mismatch")
    return f"{sys.executable} does not read the user site-packages ({why}; site.ENABLE_USER_SITE is False)"


#: sha256 of every hook module an earlier ``enable`` wrote (each version of ``core/autoload_hook.py`` and
#: ``autoload_hook.py`` in git history): ours, like this release's text; an edited one is not (P5).
EARLIER_HOOKS = frozenset({
    "11f9686c27a962acc246501ca9c397d4e6a916aa10560cf453d6c4bf565c6ac4",
    "237f3e173952e146ab898d22d4f189ba87822801e1a60d6aca9ef07915f47207",
    "35d742125b1af207aad488705b3c11f2eb5bb094bab3d729497ec8444b671f98",
    "45e281f5fd4316591bc3f53af06f56e5ba715f82384bab847932349e0508dc50",
    "4c537de241a3fda926506e0b24e98719a271ea04a4fde04423e47173b603de85",
    "56c8aa5b873a20433f71ca9fe111a35bacb3c02da2586b6f96545c1371be5ddc",
    "99d47cdaf2e379a97e179a27d84b89228c52745e775b932c0fc330b8ce3f8b69",
    "a254c261a295ca56899d29d448023b9b8eaeb7c7be2d202612fbaa091de31d4e",
    "a65f03fe63a9ba83467a7aef2adeaa432e4b7771be55514efa59f471738fd8bc",
    "fff7a3d7ca40892bf31322014814b871958bc79d0e3988fe69e8201112865f3e",
})


def is_our_hook(path: str) -> bool:
    """Whether ``path`` is a hook module ``enable`` wrote, unedited (this release's or an earlier one's)."""
    text = read_text(path)
    return text is not None and (text == hook_source()
                                 or hashlib.sha256(text.encode("utf-8")).hexdigest() in EARLIER_HOOKS)


def holds(path: str, text: str) -> bool:
    """Whether ``path`` is a regular file (not a link, mode 0644 as written) that already holds exactly ``text``."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    # threat-model: P6: the size is compared first, and read_text reads at most OURS_MAX bytes
    return (stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o644 and st.st_size == len(text.encode())
            and read_text(path) == text)


def _purelib() -> str:
    return sysconfig.get_paths()["purelib"]


@contextlib.contextmanager
def _site_lock(site_dir: str):
    """Serialise ``enable``/``disable`` on one site directory (``flock`` on it), so no ``.pth`` lacks its module;
    under it, sweep what one killed between writing and renaming left (the one sweep, P5)."""
    fd = -1
    with contextlib.suppress(OSError):
        fd = os.open(site_dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_CLOEXEC)
        fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        for name in (HOOK_FILE, PTH_NAME):
            sweep(temp_prefix(os.path.join(site_dir, name)), site_dir)
        yield
    finally:
        if fd >= 0:
            os.close(fd)  # releases the lock


def _check_site_dir(args: argparse.Namespace) -> str | None:
    """``--site-dir`` for both commands: one Python never reads (a typo, /etc, an empty one from an unset shell
    variable, not the current directory) is bad usage, not 'nothing to remove'."""
    if args.site_dir is None:
        return None
    target_dir, real = os.path.abspath(args.site_dir), os.path.realpath(args.site_dir)
    if not (args.site_dir.strip() and os.path.isdir(target_dir)
            and (os.path.basename(real) in ("site-packages", "dist-packages")
                 or any(os.path.realpath(d) == real for d in site_dirs()))):
        raise UsageError(f"--site-dir {args.site_dir!r} is not an existing site directory: Python reads .pth files "
                         f"only in directories named site-packages or dist-packages and in this interpreter's "
                         f"own ({', '.join(site_dirs()) or 'none'})", f"give one of those, or leave --site-dir "
                         f"out for {_purelib()}")
    return target_dir


def _enable(args: argparse.Namespace) -> int:
    py = f"{sys.executable} (Python {sys.version_info.major}.{sys.version_info.minor})"
    site_dir = _check_site_dir(args)
    if site_dir:
        target_dir = site_dir
        who = f"processes of {py} (or another Python) that read {target_dir} as a site directory"
    elif args.user:
        problem = user_site_problem()
        if problem:
            raise Sm120Error(f"not enabling for the user site: {problem}, so the .pth would never run there "
                             f"(and the base interpreters, which do read it, would not have this package)",
                             f"run 'flashinfer-sm120 enable' without --user to write into {_purelib()}")  # refused: 1
        target_dir = site.getusersitepackages()
        who = (f"every Python {sys.version_info.major}.{sys.version_info.minor} run by this user "
               f"outside a virtual environment (like {sys.executable})")
    else:
        target_dir = _purelib()
        who = f"every process of {py} and of any virtual environment created from it with --system-site-packages"
        if sys.prefix != sys.base_prefix:
            who = f"every process of {py} (virtual environment {sys.prefix})"
    from flashinfer_sm120.safety.fs.places import foreign_tree, foreign_tree_message
    from flashinfer_sm120.safety.ownership import trust_reason

    foreign = foreign_tree(target_dir)  # threat-model: P4 -- no missing level made inside a tree another uid owns
    if foreign is not None:
        raise PlaceError(foreign_tree_message("the site directory", foreign, "--site-dir"))
    why = trust_reason(target_dir)  # threat-model: P4 -- written only into a tree of root's or yours
    if why:
        raise PlaceError(f"the site directory {target_dir} is not safe to write into: {why}.", "enable in a site "
                         "directory that is root's or yours and that others cannot write (leave --site-dir out "
                         "for this interpreter's)")
    for name in (HOOK_FILE, PTH_NAME):  # threat-model: P5 -- a file of that name that is not ours stays
        path = os.path.join(target_dir, name)
        is_text = os.path.lexists(path) and read_text(path) is not None  # up to OURS_MAX bytes read
        editable = name == HOOK_FILE and is_text and not is_our_hook(path)  # a module you edited: --force replaces it
        if os.path.lexists(path) and not (is_text and (args.force or not editable)):
            raise PlaceError(f"{path} exists and is not what 'flashinfer-sm120 enable' wrote (another module, one "
                             f"edited since, or not a UTF-8 text file of at most {OURS_MAX >> 10} KiB); nothing "
                             "written.", "move it away"
                             + (", or pass --force to replace a module you edited" if editable else ""))
    target = os.path.join(target_dir, PTH_NAME)
    writing = target_dir
    changed = False
    try:
        os.makedirs(target_dir, exist_ok=True)
        with _site_lock(target_dir):
            for name, text in pth_files().items():  # the module first, then the .pth that imports it
                writing = os.path.join(target_dir, name)
                if name == PTH_NAME:  # lines you added to it are kept
                    text += "".join(other_lines(writing)[0])
                if holds(writing, text):  # already what this release writes: leave it (and say so)
                    continue
                write_atomic(writing, text.encode("utf-8"), mode=0o644)  # readable by every user of it
                changed = True
                if name == HOOK_FILE:  # its bytecode now, as pip does: an interpreter that may not write here
                    with contextlib.suppress(OSError, py_compile.PyCompileError):  # compiles it at each start
                        py_compile.compile(writing, doraise=True)
    except OSError as exc:
        hint = "use a virtual environment you own" if args.user else "try --user, or a virtual environment you own"
        raise PlaceError(f"cannot write {writing}: {exc.strerror or exc}", hint) from None
    undo = "flashinfer-sm120 disable" + (f" --site-dir {shlex.quote(target_dir)}" if args.site_dir else "")
    done = (f"wrote {target} and {HOOK_FILE} next to it (readable, standard library only)" if changed
            else f"already enabled: {target} and {HOOK_FILE} next to it are up to date (nothing written)")
    print(f"{done}\n"
          f"  {who} {'now loads' if changed else 'loads'} flashinfer_sm120 when it first imports {', '.join(TRIGGERS)};\n"
          f"  other processes pay nothing. Undo: '{undo}' removes both files; skip once: FLASHINFER_SM120_DISABLE=1.")
    return 0


def _disable(args: argparse.Namespace) -> int:
    removed, failed, left = [], [], []
    site_dir = _check_site_dir(args)  # else each site directory once (by real path)
    dirs = [site_dir] if site_dir else list({os.path.realpath(d): d for d in [_purelib(), *site_dirs()]}.values())
    for d in dirs:
        with _site_lock(d):
            # the .pth first: an interpreter starting meanwhile must not import a missing module
            hook = os.path.join(d, HOOK_FILE)
            hook_ours = not os.path.lexists(hook) or is_our_hook(hook)  # then its bytecode interpreters cached, too
            pycs = glob.glob(os.path.join(glob.escape(d), "__pycache__", glob.escape(MODULE_NAME) + ".*.pyc"))
            for target in [os.path.join(d, PTH_NAME), hook] + (sorted(pycs) if hook_ours else []):
                if not os.path.lexists(target):
                    continue
                owner = os.lstat(target).st_uid
                if owner != os.geteuid():  # threat-model: A2 -- another uid's copy stays, even for root
                    left.append(f"{target} (owned by uid {owner})")
                    continue
                try:
                    kept, ours = other_lines(target) if target.endswith(PTH_NAME) else ([], target != hook or hook_ours)
                    if not ours:  # threat-model: A2 -- only what enable wrote is removed
                        left.append(f"{target} (its content is not ours)")
                        continue
                    if kept:  # lines you added: keep them, drop ours
                        write_atomic(target, "".join(kept).encode("utf-8"), mode=0o644)
                        removed.append(f"our line of {target} (kept {len(kept)} of yours)")
                    else:
                        os.unlink(target)
                        removed.append(target)
                except OSError as exc:
                    failed.append(f"{target}: {exc.strerror or exc}")
            if hook_ours:
                with contextlib.suppress(OSError):  # enable's __pycache__, when nothing else is in it
                    os.rmdir(os.path.join(d, "__pycache__"))
    if removed:
        print("removed " + ", ".join(removed))
    if left:
        print("kept " + ", ".join(left) + ": not written by 'flashinfer-sm120 enable' for you; remove it "
              "yourself if you want it gone")
    if failed:
        raise PlaceError("could not remove " + "; ".join(failed), "run as the user who owns it")
    if not removed and not left:
        print("nothing to remove (no " + PTH_NAME + " in " + ", ".join(dirs) + ")")
    return 0


_CODES = ("Exit status 0: done, or nothing to do; 1: refused (the message names the file or directory and the "
          "fix); 2: bad usage (an empty --site-dir, or one that is not a site directory).")


def add_parsers(sub) -> None:
    """Register the ``enable`` and ``disable`` subcommands."""
    e = sub.add_parser("enable", help="load flashinfer_sm120 in every process that imports "
                       + "/".join(TRIGGERS) + " (writes a .pth file and its module)",
                       description="Write a .pth file and its small module into this environment's site "
                       "directory, so that every Python process that first imports " + ", ".join(TRIGGERS)
                       + " loads flashinfer_sm120 (vLLM and SGLang workers included); other processes pay "
                       "nothing. Running it again changes nothing. Undo: 'flashinfer-sm120 disable'. " + _CODES)
    e.add_argument("--user", action="store_true",
                   help="user site-packages instead of this environment (refused inside a virtualenv)")
    e.add_argument("--site-dir", help="write into this directory instead (must be a site directory)")
    e.add_argument("--force", action="store_true",
                   help=f"replace a {HOOK_FILE} there that is not what enable wrote (one you edited)")
    e.set_defaults(func=_enable)
    dis = sub.add_parser("disable", help="remove the files written by 'enable' (works with the package broken)",
                         description="Remove the .pth file and module written by 'enable' (lines you added to "
                         "the .pth are kept). Works with a dependency or another module of the package missing or broken. "
                         + _CODES)
    dis.add_argument("--site-dir", help="remove it from this directory only")
    dis.set_defaults(func=_disable)
