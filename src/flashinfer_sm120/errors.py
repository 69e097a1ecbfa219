"""The one exception hierarchy of flashinfer-sm120: every error raised on purpose derives from
:class:`Sm120Error`, and its message names the offending value or path and the fix (P8)."""

from __future__ import annotations


class Sm120Error(RuntimeError):
    """Base class of every error raised by flashinfer-sm120; ``fix`` is the fix line alone, or ``""``."""

    def __init__(self, message: str = "", fix: str = "") -> None:
        super().__init__(message)
        self.fix = fix

    def __reduce__(self):  # keep ``fix`` and a subclass's fields across pickling (multiprocessing workers)
        return (type(self), (str(self),), self.__dict__)


class UsageError(Sm120Error):
    """A command line that cannot be run; the CLI prints it on stderr, and with ``--json`` as its one document."""

    kind = "usage"


class ToolkitError(Sm120Error):
    """No toolkit can build the wanted targets: each candidate with why it was rejected, then the fix."""


class ViewError(Sm120Error):
    """The ``CUDA_HOME`` view could not be assembled; the message names the path and the fix."""


class PlaceError(Sm120Error):
    """A directory we would create something in is not a place of our own (another uid owns or may change a level)."""


class StateFileError(Sm120Error):
    """An on-disk state file (memo, view metadata) is unusable; the message names it."""


class FormatError(Sm120Error, ValueError):
    """Something read from outside does not have the expected form: ``source`` (what was read, or ``""``),
    ``problem`` (what is wrong, without source and fix) and ``fix``, so that no caller cuts the message apart."""

    def __init__(self, message: str = "", *, source: str = "", problem: str = "", fix: str = "") -> None:
        super().__init__(message, fix)
        self.source, self.problem = source, problem or message
