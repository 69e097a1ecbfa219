"""flashinfer-sm120: make FlashInfer JIT-build for the right GPUs with the right nvcc.

Start with 'flashinfer-sm120 doctor' (a verdict, and the fix when something is wrong). Commands:
doctor (check everything), status (one line, for scripts), build (JIT-build kernels now), enable/disable (load
flashinfer_sm120 in every Python process that uses FlashInfer). Run without a command, this help is printed and
the exit status is 2."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import errno
import importlib
import json
import os
import re
import signal
import sys

from flashinfer_sm120 import __version__
from flashinfer_sm120.core.facts.reinstall import fix_for
from flashinfer_sm120.cli import enable
from flashinfer_sm120.safety.formats.base import bounded, shown
from flashinfer_sm120.cli.common import err


def _broken_parser(sub, name: str, exc: BaseException) -> None:
    """``name`` registered as a command that says why it is unavailable (build's document imports nothing: it
    prints even now)."""
    from flashinfer_sm120.cli.buildjson import failure

    p = sub.add_parser(name, help=f"unavailable: {exc!r}", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=lambda args: _broken(f"'{name}' is unavailable: this install", exc, "--json" in args.rest,
                                             failure if name == "build" else None))


def _broken(what: str, exc: BaseException, json_wanted: bool, document) -> int:
    """A module or dependency of this package missing or broken: the message and its fix, no traceback."""
    msg, fix = f"{what} is broken ({exc!r})", fix_for(exc)
    if json_wanted:
        _print_failure_json(document, msg, "broken-install", fix)
    return err(f"{msg}; Fix: {fix}")


def _print_failure_json(document, message: str, kind: str, fix: str) -> None:
    """One JSON document whatever went wrong (threat-model: P8): the command's ``json_failure``, else the generic one."""
    message, fix = bounded(message), bounded(fix or "")
    doc = document(message, kind, fix) if document else {"ok": False, "error": {"kind": kind, "message": message,
                                                                                  "fix": fix}}
    print(json.dumps(doc, indent=2))


class _Parser(argparse.ArgumentParser):
    """argparse with close-match hints; with ``json_errors`` an error raises ``UsageError`` (printed as JSON, P8)."""

    json_errors = False
    argv: list[str] = []  # the command line being parsed (set by main), to name a value argparse took for an option

    def error(self, message: str):  # type: ignore[override]
        e = re.match(r"argument ([^:]+): expected one argument$", message)
        dashed = [(o, v) for o, v in zip(self.argv, self.argv[1:]) if e and o in e.group(1).split("/") and v[:1] == "-"]
        for opt, value in dashed[:1]:  # `--mem-limit -5G`: argparse reads -5G as an option
            message += (f"; the value {shown(value, 80)} starts with '-' and was read as an option: "
                        f"join it, as {opt}={shown(value, 80)[1:-1]}")
        m = re.match(r"argument [^:]+: invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if m:  # argparse quotes the bad choice whole: shown cut, as every value we name
            message = message.replace(f"'{m.group(1)}'", shown(m.group(1), 80), 1)
            choices = [c.strip().strip("'") for c in m.group(2).split(",")]
            close = difflib.get_close_matches(m.group(1), choices, n=1, cutoff=0.6)
            if close and "maybe you meant" not in message:  # Python 3.15 suggests on its own
                message += f"; did you mean {close[0]!r}?"
        if self.json_errors:
            from flashinfer_sm120.errors import UsageError

            raise UsageError(bounded(message), fix=f"see '{self.prog} --help'")
        super().error(bounded(message))  # argparse quotes a bad choice or argument whole


# ----------------------------------------------------------------------------- --version: this package, Python,
# FlashInfer, torch and its CUDA, and the nvcc that would be chosen; each part read on its own, so a missing or
# broken one is named and the rest still prints


def _torch_cuda() -> str:
    """torch's CUDA, read from ``torch/version.py`` (importing torch takes seconds)."""
    from flashinfer_sm120.core.toolkit.ninja import package_dir

    where = package_dir("torch")
    try:
        text = open(os.path.join(where, "version.py"), encoding="utf-8").read() if where else ""
    except (OSError, ValueError):  # unreadable, or not UTF-8
        return "CUDA unknown"
    m = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
    return f"CUDA {m.group(1)}" if m else "CPU build"


def _nvcc() -> str:
    """The nvcc flashinfer-sm120 chooses: from the last recorded status when it still holds, else resolved."""
    try:
        from flashinfer_sm120.cli.status import recorded

        tk = (recorded()[0] or {}).get("toolkit")
        if tk:
            return f"nvcc {tk['nvcc_full']} at {tk['root']} (chosen)"
        from flashinfer_sm120.core.patch.decide import resolve

        res = resolve(guard=True)
        if res.choice is None:
            return f"nvcc: none fits ({res.fix or 'flashinfer-sm120 doctor'})"
        return f"nvcc {res.choice.toolkit.nvcc_full} at {res.choice.toolkit.root} (chosen)"
    except Exception as exc:
        return f"nvcc: unknown ({type(exc).__name__}: {exc})"[:300]


def version_lines() -> list[str]:
    """One line per component; never raises."""
    from flashinfer_sm120.core.facts.precompiled import dist_version

    lines = [f"flashinfer-sm120 {__version__} ({os.path.dirname(os.path.dirname(os.path.abspath(__file__)))})",
             f"Python {sys.version.split()[0]} ({sys.executable})"]
    fi = dist_version("flashinfer-python")
    lines.append(f"FlashInfer {fi}" if fi else "FlashInfer: not installed (pip install flashinfer-python)")
    torch = dist_version("torch")
    lines.append(f"torch {torch} ({_torch_cuda()})" if torch else "torch: not installed")
    lines.append(_nvcc())
    return lines


def build_parser() -> argparse.ArgumentParser:
    """The ``flashinfer-sm120`` parser with every subcommand (the docs' CLI reference is made from it)."""
    parser = _Parser(prog="flashinfer-sm120", description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="store_true",
                        help=f"print the versions of flashinfer-sm120 ({__version__}), Python, FlashInfer, torch "
                             f"and its CUDA, and the nvcc that would be chosen, then exit")
    sub = parser.add_subparsers(dest="cmd", required=False, metavar="command")
    for name in ("doctor", "status", "build"):
        try:  # each from its own module, so that one broken module leaves the other commands working
            importlib.import_module(f".{name}", __name__).add_parser(sub)
        except Exception as exc:
            _broken_parser(sub, name, exc)
    enable.add_parsers(sub)
    for choice in sub._choices_actions:  # every --help opens with a description: its one-line help by default
        sp = sub.choices[choice.dest]
        if not sp.description and choice.help:
            sp.description = choice.help[0].upper() + choice.help[1:] + "."
    return parser


def _selected(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The subcommand's parser ``argv`` names, read from the words (argparse may have refused it)."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return next((sub.choices[word] for word in argv if word in sub.choices), parser)


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


#: Most command-line arguments taken: argparse's parse time grows with their number squared (P6).
MAX_ARGS = 4096


def _open_std_fds() -> None:
    """Open descriptors 0-2 closed at start on ``/dev/null``, so that no file the command opens takes 1 or 2."""
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        with contextlib.suppress(OSError):
            try:
                os.fstat(fd)
            except OSError:  # the lowest free descriptor, 0-2 being checked in order: fd itself
                os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY)
            if getattr(sys, name) is None:
                setattr(sys, name, open(fd, "r" if fd == 0 else "w", closefd=False))


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``flashinfer-sm120``: the exit status (141 when the reader stops early, as for SIGPIPE)."""
    _open_std_fds()
    mask = os.umask(0o022)
    os.umask(mask | 0o022)  # what a command makes (FlashInfer's JIT tree too) is never others' to write (P4)
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
        return err(f"cannot write the output ({exc.strerror}): free space where stdout goes, or send it "
                   f"elsewhere")
    finally:
        os.umask(mask)


def _from_printing(exc: OSError) -> bool:
    """Whether ``exc`` came from printing: raised directly in this package, which writes no files of its own."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and os.path.dirname(tb.tb_frame.f_code.co_filename) == os.path.dirname(__file__)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that the flush at exit does not fail again (``signal`` docs, SIGPIPE)."""
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _main(argv: list[str] | None) -> int:
    for stream in (sys.stdout, sys.stderr):  # a path that is not UTF-8 prints as \udcff, as Python's stderr does
        with contextlib.suppress(AttributeError, ValueError, OSError):  # not a TextIOWrapper, or closed
            stream.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    # threat-model: P8: with --json, a refused command line is the one JSON document too
    json_wanted = _Parser.json_errors = "--json" in argv
    _Parser.argv = list(argv)
    from flashinfer_sm120.errors import Sm120Error, UsageError

    try:
        if len(argv) > MAX_ARGS:  # refused before argparse walks them; with --json, as its one document too
            raise UsageError(f"{len(argv)} command-line arguments, more than the {MAX_ARGS} taken",
                             "give long lists of modules as a manifest (build --from MANIFEST)")
        try:  # relative paths (ours, FlashInfer's, torch's) cannot be resolved in a removed directory
            os.getcwd()
        except OSError as exc:
            raise Sm120Error(f"the working directory cannot be read ({exc.strerror}): it was removed, or is not "
                             "yours to enter", "cd to an existing directory and run the command again") from None
        return _parsed(parser, argv)
    except Sm120Error as exc:  # the one exit-code rule: 2 for the command line, 1 for a refusal (P8)
        if json_wanted:
            document = _selected(parser, argv).get_default("json_failure")
            _print_failure_json(document, str(exc), getattr(exc, "kind", "refused"), exc.fix)
        sep = " " if str(exc).endswith((".", "?")) else "; "  # a message of sentences gets a sentence
        err(f"{exc}{sep}Fix: {exc.fix}" if exc.fix and exc.fix not in str(exc) else str(exc))
        return 2 if isinstance(exc, UsageError) else 1


def _parsed(parser: argparse.ArgumentParser, argv: list[str]) -> int:
    args, extras = parser.parse_known_args(argv)
    if args.version and args.cmd is None:
        print("\n".join(version_lines()))
        return 0
    if args.cmd is None and not extras:
        # a bare call: the help, as git and docker print it, with argparse's status for "no command run"
        parser.print_help()
        return 2
    if extras and isinstance(getattr(args, "modules", None), list):
        # argparse leaves a positional after an option to the caller ('build sampling --act gelu activation'):
        # words go with the module names (build names an unknown one), options are refused below
        args.modules += [x for x in extras if not x.startswith("-")]
        extras = [x for x in extras if x.startswith("-")]
    if extras:  # the subcommand's own usage, and the option that was probably meant
        chosen = _selected(parser, argv)
        chosen.error(_unknown(chosen, extras))
    from flashinfer_sm120.safety.proc import signals_as_exit

    # threat-model: P4: a command that only lists creates nothing in FlashInfer's cache: status and doctor
    # import FlashInfer with its workspace in a private directory, after the checks
    if args.cmd in ("status", "doctor"):
        from flashinfer_sm120.warmup.session import only_list

        only_list()
    try:
        with signals_as_exit():  # 'kill' or a closed terminal stops what the command started, as Ctrl-C does
            return args.func(args)
    except (KeyboardInterrupt, SystemExit) as exc:  # threat-model: P8: a document for this outcome too
        code = 130 if isinstance(exc, KeyboardInterrupt) else exc.code
        if getattr(args, "json", False) and isinstance(code, int) and 128 < code < 128 + 65:
            name = signal.Signals(code - 128).name
            _print_failure_json(getattr(args, "json_failure", None), f"interrupted by {name}: what it started was "
                                f"stopped", "interrupted", "run the command again")
        raise
    except ImportError as exc:  # a dependency missing or broken: one line with the fix, no traceback
        if (getattr(exc, "name", None) or "").partition(".")[0] in ("flashinfer", "torch"):
            raise
        return _broken("this install", exc, getattr(args, "json", False), getattr(args, "json_failure", None))
