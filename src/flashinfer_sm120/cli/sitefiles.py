"""What ``enable`` and ``disable`` count as theirs in a site directory: which directories Python reads
``.pth`` files in, and whether a file there holds what a version of ``enable`` wrote (threat-model: P5:
a file that is not ours, or ours edited, is never overwritten or removed without ``--force``).

Standard library and :mod:`flashinfer_sm120.core.autoload` only: ``disable`` must work with the rest
of the package broken.
"""

from __future__ import annotations

import hashlib
import os
import site
import stat

from flashinfer_sm120.core.autoload import hook_source

__all__ = ["OURS_MAX", "EARLIER_HOOKS", "site_dirs", "is_site_dir", "read_text", "is_our_hook", "other_lines",
           "holds"]


def site_dirs() -> list[str]:
    """This interpreter's site directories (``site.getsitepackages()`` and the user site)."""
    dirs = list(getattr(site, "getsitepackages", lambda: [])()) + [site.getusersitepackages()]
    return [d for d in dirs if isinstance(d, str) and d]


def is_site_dir(path: str) -> bool:
    """Whether Python would read a ``.pth`` in ``path``: it is named ``site-packages`` or
    ``dist-packages`` (Debian's), or it is one of :func:`site_dirs`."""
    real = os.path.realpath(path)
    return (os.path.basename(real) in ("site-packages", "dist-packages")
            or any(os.path.realpath(d) == real for d in site_dirs()))


#: Bytes of a ``.pth`` or hook file read to tell whether it is ours; a larger one is not.
OURS_MAX = 256 << 10
#: sha256 of every hook module an earlier version of ``enable`` wrote (each version of
#: ``core/autoload_hook.py`` and, before the layers, ``autoload_hook.py`` in git history; earlier releases
#: wrote no module).  A file holding one of these or this release's text is ours; an edited one is not
#: (threat-model: P5): ``enable`` keeps it unless ``--force``, ``disable`` keeps it.
EARLIER_HOOKS = frozenset({
    "35d742125b1af207aad488705b3c11f2eb5bb094bab3d729497ec8444b671f98",
    "45e281f5fd4316591bc3f53af06f56e5ba715f82384bab847932349e0508dc50",
    "4c537de241a3fda926506e0b24e98719a271ea04a4fde04423e47173b603de85",
    "56c8aa5b873a20433f71ca9fe111a35bacb3c02da2586b6f96545c1371be5ddc",
    "a65f03fe63a9ba83467a7aef2adeaa432e4b7771be55514efa59f471738fd8bc",
    "a254c261a295ca56899d29d448023b9b8eaeb7c7be2d202612fbaa091de31d4e",
})


def read_text(path: str) -> str | None:
    """The text of the regular file ``path`` (not followed through a link, never blocking on a FIFO),
    or ``None`` when it is not one, is over :data:`OURS_MAX` bytes or is not UTF-8."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        raw = b""
        while len(raw) <= OURS_MAX and (chunk := os.read(fd, OURS_MAX + 1 - len(raw))):
            raw += chunk
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        return raw.decode("utf-8") if len(raw) <= OURS_MAX else None
    except UnicodeDecodeError:
        return None


def is_our_hook(path: str) -> bool:
    """Whether ``path`` is a hook module ``enable`` wrote, unedited (this release's or an earlier one's)."""
    text = read_text(path)
    return text is not None and (text == hook_source()
                                 or hashlib.sha256(text.encode("utf-8")).hexdigest() in EARLIER_HOOKS)


def other_lines(pth: str) -> tuple[list[str], bool]:
    """``(lines of the .pth at pth that are not ours, whether one of ours is there)``: a line is ours
    when it names ``flashinfer_sm120`` (older releases wrote other lines); lines someone
    added are kept by ``disable`` and ``enable`` rather than deleted or overwritten.  A ``.pth`` that
    is not a regular file, is over 256 KiB or is not UTF-8 text is not ours: ``([], False)``."""
    text = read_text(pth)
    if text is None:
        return [], False
    lines = [ln if ln.endswith("\n") else ln + "\n" for ln in text.splitlines(keepends=True)]
    ours = [ln for ln in lines if "flashinfer_sm120" in ln]  # this release's line, or an older release's
    return [ln for ln in lines if ln.strip() and ln not in ours], bool(ours)


def holds(path: str, text: str) -> bool:
    """Whether ``path`` is a regular file (not a link, mode 0644 as written) that already holds exactly ``text``."""
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or stat.S_IMODE(st.st_mode) != 0o644:
            return False
        if st.st_size != len(text.encode()):  # threat-model: P6: never read a file whole to compare it
            return False
        with open(path, encoding="utf-8") as fh:
            return fh.read(len(text) + 1) == text
    except (OSError, UnicodeDecodeError):
        return False
