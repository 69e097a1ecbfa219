"""The one exception hierarchy of flashinfer-sm120.

Every error this package raises on purpose derives from :class:`Sm120Error`, and
every message names the offending value or path and the fix.
"""

from __future__ import annotations


__all__ = ["Sm120Error", "UsageError", "ToolkitError", "ViewError", "PlaceError", "StateFileError", "FormatError"]


class Sm120Error(RuntimeError):
    """Base class of every error raised by flashinfer-sm120."""


class UsageError(Sm120Error):
    """A command line that cannot be run (an unknown option, a bad value): argparse's message, or
    ours, naming the value.  ``kind`` is ``"usage"``; ``fix`` says what to type instead.  The CLI
    prints it as one line on stderr, and with ``--json`` as the command's one JSON document too."""

    kind = "usage"

    def __init__(self, message: str = "", fix: str = "") -> None:
        super().__init__(message)
        self.fix = fix

    def __reduce__(self):
        return (type(self), (str(self), self.fix))


class ToolkitError(Sm120Error):
    """No toolkit can build the wanted targets; the message lists each candidate
    with the reason it was rejected, and ends with the one fix line.

    Attributes:
        fix: the fix line alone (also the message's last line, after ``Fix:``),
            or ``""`` when the raiser gave none.
    """

    def __init__(self, message: str = "", fix: str = "") -> None:
        super().__init__(message)
        self.fix = fix

    def __reduce__(self):  # keep ``fix`` across pickling (multiprocessing workers)
        return (type(self), (str(self), self.fix))


class ViewError(Sm120Error):
    """The ``CUDA_HOME`` view could not be assembled; the message names the path and the fix."""



class PlaceError(Sm120Error):
    """A directory we would create something in (a temporary directory) is not a place of our own:
    another uid owns or may change a level of it.  The message names it and the fix."""


class StateFileError(Sm120Error):
    """An on-disk state file (memo, view metadata) is unusable; the message names it."""


class FormatError(Sm120Error, ValueError):
    """Something read from outside (a file, a variable, a command's output, a CLI
    value) does not have the expected form; the message names the file or
    variable, shows the offending value cut short, and says the fix.

    Attributes (so that no caller cuts the message apart):
        source: what was read (``"FLASHINFER_CUDA_ARCH_LIST"``, a file and line), or ``""``.
        problem: what is wrong with it, without the source and the fix (the message when not given).
        fix: the fix alone, or ``""``.
    """

    def __init__(self, message: str = "", *, source: str = "", problem: str = "", fix: str = "") -> None:
        super().__init__(message)
        self.source, self.problem, self.fix = source, problem or message, fix

    def __reduce__(self):  # keep the fields across pickling (multiprocessing workers)
        return (_format_error, (str(self), self.source, self.problem, self.fix))


def _format_error(message: str, source: str, problem: str, fix: str) -> FormatError:
    return FormatError(message, source=source, problem=problem, fix=fix)
