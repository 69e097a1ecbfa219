"""Gather the toolkit candidates: every find step of :data:`~flashinfer_sm120.core.toolkit.sources.FIND_STEPS`
run in order, one entry per real nvcc, each inspected only when first looked at."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from flashinfer_sm120.core.toolkit.model import Toolkit
from flashinfer_sm120.core.toolkit.probe import NVCC_TIMEOUT_S, inspect
from flashinfer_sm120.core.toolkit.sources import FIND_STEPS, Found

__all__ = ["Candidates", "discover"]


def _raw_candidates(env: Mapping[str, str]) -> list[Found]:
    """Every step's findings in order; roots may repeat."""
    out: list[Found] = []
    for _label, step in FIND_STEPS:
        out.extend(step(env))
    return out


class Candidates(Sequence):
    """Toolkit candidates in preference order, inspected only when first looked at.

    :func:`choose` stops at the first acceptable toolkit, so the usual start-up
    reads the files of one or two toolkits, not every toolkit on the machine.
    ``len()`` and iteration are cheap to ask for; items are :class:`Toolkit`.
    """

    def __init__(self, raw: list[tuple[tuple[str, ...], str, str, str | None]], timeout: float) -> None:
        self._raw = raw  # (sources, root, given_as, known problem)
        self._timeout = timeout
        self._done: dict[int, Toolkit] = {}

    def __len__(self) -> int:
        return len(self._raw)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if i not in self._done:
            sources, root, given, problem = self._raw[i]
            self._done[i] = (Toolkit(root=root, sources=sources, given_as=given, problem=problem) if problem
                             else inspect(root, sources, given, timeout=self._timeout))
        return self._done[i]

    def is_read(self, i: int) -> bool:
        """Whether candidate ``i`` has been inspected (its files read) already."""
        return i in self._done

    def peek(self, i: int) -> Toolkit:
        """The toolkit if already inspected, else a placeholder with root and sources only."""
        if i in self._done:
            return self._done[i]
        sources, root, given, _problem = self._raw[i]
        return Toolkit(root=root, sources=sources, given_as=given)


def discover(env: dict[str, str] | None = None, *, timeout: float = NVCC_TIMEOUT_S) -> Candidates:
    """All candidate toolkits, in preference order, one entry per real nvcc.

    Sources, in order (:data:`FIND_STEPS`): ``CUDA_HOME``, ``CUDA_PATH`` (cleaned
    of a leading ``:`` and a trailing ``/bin``), pip wheels
    (``site-packages/nvidia/cu13`` in every site directory; cuda-pathfinder's
    pick first), ``nvcc`` on ``PATH`` (symlinks and wrapper scripts followed;
    Debian's ``/usr`` layout recognised), ``/usr/local/cuda``,
    ``/usr/local/cuda-X.Y`` (newest first), ``$CONDA_PREFIX``.

    Args:
        env: environment to read (default ``os.environ``).
        timeout: seconds allowed per ``nvcc --version`` fallback.

    Returns:
        A lazy sequence of :class:`Toolkit`, including unusable ones (their
        ``problem`` is set), e.g. a ``CUDA_HOME`` that does not exist.
    """
    env = dict(os.environ if env is None else env)
    merged: dict[str, tuple[list[str], str, str]] = {}
    order: list[str] = []
    bad: list[tuple[tuple[str, ...], str, str, str | None]] = []
    for source, root, given, problem in _raw_candidates(env):
        if problem:
            bad.append(((source,), root, given, problem))
            continue
        if not os.path.isdir(root):
            if source in ("CUDA_HOME", "CUDA_PATH", "conda"):
                bad.append(((source,), root, given, None))
            continue
        # Dedupe on the real path (cheap); wrappers are followed later by inspect().
        key = os.path.realpath(os.path.join(root, "bin", "nvcc"))
        if key in merged:
            if source not in merged[key][0]:
                merged[key][0].append(source)
            continue
        merged[key] = ([source], root, given)
        order.append(key)
    raw = bad + [(tuple(merged[k][0]), merged[k][1], merged[k][2], None) for k in order]
    return Candidates(raw, timeout)
