"""flashinfer-sm120: make FlashInfer JIT-build for the right GPUs with the right nvcc.

Commands: doctor (what was found and chosen), status (one line), build (JIT-build
kernels now), cache (export, import or prune FlashInfer's JIT cache), enable/disable (load flashinfer_sm120
in every Python process that uses FlashInfer)."""

from __future__ import annotations

import argparse
import difflib
import errno
import importlib
import os
import re
import sys

from .. import __version__
from ..reinstall import fix_for
from . import enable

try:
    from .build import MODULES
except Exception:  # a broken install: 'disable' must still work
    MODULES = {}

__all__ = ["main", "MODULES"]


def _broken_parser(sub, name: str, exc: BaseException) -> None:
    def fail(args) -> int:
        from .common import err

        msg = f"'{name}' is unavailable: this install is broken ({exc!r}); Fix: {fix_for(exc)}"
        if "--json" in args.rest:
            _print_failure_json(name, msg)
        return err(msg)

    p = sub.add_parser(name, help=f"unavailable: {exc!r}", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=fail)


def _print_failure_json(command: str | None, msg: str, document=None) -> None:
    """``--json`` promises one JSON document on stdout, whatever went wrong: ``document(msg)``
    (the command's own shape), else build's, else the ``status`` shape (mode ``failed``)."""
    import json

    if document is None and command == "build":
        from .buildjson import document
    print(json.dumps(document(msg) if document else {"mode": "failed", "error": msg}))


class _Parser(argparse.ArgumentParser):
    """argparse, plus a close-match hint for a mistyped subcommand or choice where argparse
    has none of its own (``suggest_on_error`` is new in Python 3.14)."""

    def error(self, message: str):  # type: ignore[override]
        m = re.match(r"argument [^:]+: invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if m and "maybe you meant" not in message:
            choices = [c.strip().strip("'") for c in m.group(2).split(",")]
            close = difflib.get_close_matches(m.group(1), choices, n=1, cutoff=0.6)
            if close:
                message += f"; did you mean {close[0]!r}?"
        from .common import bounded

        message = bounded(message)  # argparse quotes a bad choice or argument whole
        if _json_asked(self):  # threat-model: P8 (one JSON document for every outcome, usage errors too)
            document = self._defaults.get("usage_failure") or self._defaults.get("json_failure")
            _print_failure_json(None, f"{self.prog}: {message}", document)
        super().error(message)


#: The command line being parsed (``_main`` sets it): a refusal by argparse tells from it whether
#: ``--json`` was asked for.
_ARGV: list[str] = []


def _json_asked(parser: argparse.ArgumentParser) -> bool:
    """Whether ``parser`` (the subcommand refusing the command line) takes ``--json`` and the command
    line gives it (before a ``--``, after which everything is a positional)."""
    if not any("--json" in a.option_strings for a in parser._actions):
        return False
    words = _ARGV[:_ARGV.index("--")] if "--" in _ARGV else _ARGV
    return "--json" in words


def build_parser() -> argparse.ArgumentParser:
    """The ``flashinfer-sm120`` parser with every subcommand (the docs' CLI reference is made from it)."""
    parser = _Parser(prog="flashinfer-sm120", description=__doc__)
    parser.add_argument("--version", action="version", version=__version__)
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="command")
    for name, register in (("doctor", "add_parser"), ("status", "add_parser"), ("build", "add_parser"),
                           ("cache", "add_parsers")):
        try:  # each from its own module, so that one broken module leaves the other commands working
            getattr(importlib.import_module(f".{name}", __name__), register)(sub)
        except Exception as exc:
            _broken_parser(sub, name, exc)
    enable.add_parsers(sub)
    for p in _parsers(parser):
        # Python 3.14+: "maybe you meant" for mistyped subcommands and choices; an attribute,
        # not the keyword, so older releases ignore it (argparse docs, suggest_on_error).
        p.suggest_on_error = True
    return parser


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """``parser`` and every subparser under it."""
    out = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for p in dict.fromkeys(action.choices.values()):
                out += _parsers(p)
    return out


def _chosen(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The innermost subparser the command line selected (``cache export`` -> its parser)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            name = getattr(args, action.dest, None)
            if name in action.choices:
                return _chosen(action.choices[name], args)
    return parser


def _unknown(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    """``unrecognized arguments: --headdim (did you mean --head-dim?)``."""
    options = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    hints = []
    for arg in extras:
        given = arg.split("=", 1)[0]
        close = difflib.get_close_matches(given, options, n=1, cutoff=0.6) if arg.startswith("-") else []
        if close:
            hints.append(f"did you mean {close[0]}?" if len(extras) == 1 else f"for {given}, did you mean {close[0]}?")
    return f"unrecognized arguments: {' '.join(extras)}" + "".join(f"; {h}" for h in hints)


#: Most command-line arguments taken: argparse's parse time grows with the square of their number,
#: and no command needs more than a few dozen.
MAX_ARGS = 4096


def _safe_streams() -> None:
    """Never fail on printing: a path from the environment or the disk may hold bytes that are not
    UTF-8 (lone surrogates after ``os.fsdecode``); they are written as ``\\udcff``, as Python's stderr does."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):  # not a TextIOWrapper, or closed
            pass


def _open_std_fds() -> None:
    """Descriptors 0-2 closed at start (``doctor >&- 2>&-``, a daemon's unit) are opened on ``/dev/null``,
    so that ``sys.stdout`` exists and no file the command opens takes descriptor 1 or 2."""
    for fd, mode, name in ((0, os.O_RDONLY, "stdin"), (1, os.O_WRONLY, "stdout"), (2, os.O_WRONLY, "stderr")):
        try:
            os.fstat(fd)
        except OSError:
            try:
                null = os.open(os.devnull, mode)  # the lowest free descriptor: this one
                if null != fd:
                    os.dup2(null, fd)
                    os.close(null)
            except OSError:
                continue
        if getattr(sys, name) is None:
            try:
                setattr(sys, name, open(fd, "r" if fd == 0 else "w", closefd=False))
            except OSError:
                pass


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``flashinfer-sm120`` command; returns the exit status.

    A reader that stops early (``flashinfer-sm120 doctor | head``) ends the command quietly with
    exit status 141 (128 + SIGPIPE, as a shell reports it), not a ``BrokenPipeError`` traceback."""
    _open_std_fds()
    try:
        rc = _main(argv)
        sys.stdout.flush()  # here, not at interpreter exit, where a closed pipe prints a traceback
        return rc
    except BrokenPipeError:
        _quiet_stdout()
        return 141
    except KeyboardInterrupt:  # Ctrl-C: what the command started was stopped in its finally clauses
        print("flashinfer-sm120: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:  # stdout on a full disk (doctor > report.txt): a message, not a traceback
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO) or not _from_printing(exc):
            raise
        _quiet_stdout()
        from .common import err

        return err(f"cannot write the output ({exc.strerror}): free space where stdout goes, or send it "
                   f"elsewhere")


def _from_printing(exc: OSError) -> bool:
    """Whether ``exc`` came from writing the command's output: raised by a C call (``print``,
    ``sys.stdout.write``/``flush``) made directly in this CLI package, which writes no files of
    its own outside ``enable`` (which reports its own errors); the state and cache writes of the
    commands live in other packages.  (A failed write drops Python's buffer, so stdout cannot
    simply be flushed again to tell.)"""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and os.path.dirname(tb.tb_frame.f_code.co_filename) == os.path.dirname(__file__)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that the flush at interpreter exit does not fail again
    (Python's docs, ``signal``, "Note on SIGPIPE")."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def lists_only(args: argparse.Namespace) -> bool:
    """Whether the command only lists (``cache prune`` without ``--yes``): it then creates no
    directory or file of flashinfer-sm120's.  (``status`` and ``doctor`` import FlashInfer with the
    patch, as a server does, views included: they create what that import creates, under the same
    checks.)"""
    return args.cmd == "cache" and getattr(args, "cache_cmd", None) == "prune" and not getattr(args, "yes", False)


def _main(argv: list[str] | None) -> int:
    _safe_streams()
    argv = sys.argv[1:] if argv is None else argv
    global _ARGV
    _ARGV = list(argv)
    if len(argv) > MAX_ARGS:
        from .common import err

        return err(f"{len(argv)} command-line arguments, more than the {MAX_ARGS} taken; give long lists of "
                   f"modules as a manifest (build --from MANIFEST)")
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras and isinstance(getattr(args, "modules", None), list):
        # argparse leaves a positional after an option to the caller ('build sampling --act
        # gelu activation'): module names go with the others, anything else is refused below
        names = [x for x in extras if not x.startswith("-")]
        if len(names) == len(extras):
            args.modules += names
            extras = []
        else:  # a mistyped option among them: only the option is unrecognized, not a module name
            args.modules += [x for x in names if x in MODULES or x == "all"]
            extras = [x for x in extras if x not in args.modules]
    if extras:  # the subcommand's own usage, and the option that was probably meant
        _chosen(parser, args).error(_unknown(_chosen(parser, args), extras))
    from ..proc import signals_as_exit

    if lists_only(args):  # threat-model: P4 (a command that only lists creates nothing)
        from ..cache import listing_only

        listing_only()
    try:
        with signals_as_exit():  # 'kill' or a closed terminal stops what the command started, as Ctrl-C does
            return args.func(args)
    except ImportError as exc:  # a dependency missing or broken: one line with the fix, no traceback
        if (getattr(exc, "name", None) or "").partition(".")[0] in ("flashinfer", "torch"):
            raise
        from .common import err

        msg = f"this install is broken ({exc!r}); Fix: {fix_for(exc)}"
        if getattr(args, "json", False):
            _print_failure_json(args.cmd, msg, getattr(args, "json_failure", None))
        return err(msg)
