"""The view format: its metadata (:class:`ViewMeta`) and the check before adoption (:func:`check_view`).

Nothing here writes; :mod:`.build` assembles views in this format.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from dataclasses import asdict, dataclass

from flashinfer_sm120.safety.fs.atomic import read_json
from flashinfer_sm120.safety.ownership import mine_problem
from flashinfer_sm120.errors import FormatError
from flashinfer_sm120.safety.formats.reads import field
from flashinfer_sm120.safety.formats.grammar import parse_version
from flashinfer_sm120.safety.formats.base import shown, some
from flashinfer_sm120.core.toolkit.model import Toolkit
from flashinfer_sm120.core.toolkit.memo import fingerprint

__all__ = ["VIEW_LAYOUT", "META_NAME", "ADDED_ITEMS", "STUB", "DIRS", "REQUIRED", "CudaHome", "ViewMeta",
           "check_view"]

#: Bumped whenever the view layout or metadata changes, so old views are not reused.
VIEW_LAYOUT = 3
#: The metadata file in every view.
META_NAME = "flashinfer_sm120_view.json"
#: The names build.py gives views (``cuda-<nvcc version>-<key>[.N]``): ``cache prune`` removes nothing else.
VIEW_NAME_RE = re.compile(r"cuda-[0-9A-Za-z.+]+-[0-9a-f]{8,64}(\.[0-9]{1,3})?")
#: What a view may add to its toolkit.
ADDED_ITEMS = ("lib64/libcudart.so", "lib64/stubs/libcuda.so", "include/curand.h")
#: Where the ``libcuda.so`` link stub lives in a view (FlashInfer's ``-L$cuda_home/lib64/stubs``).
STUB = "lib64/stubs/libcuda.so"
#: The real directories of a view ("" is the view itself); every other entry is a symlink.
DIRS = ("", "include", "lib64", "lib64/stubs")
#: What FlashInfer's build lines need from ``$cuda_home``.
REQUIRED = ("bin/nvcc", "include/cuda_runtime_api.h", "lib64/libcudart.so", STUB)


@dataclass(frozen=True)
class CudaHome:
    """``CUDA_HOME`` for FlashInfer: ``path``, the toolkit behind it, whether it is a view, what the view
    adds, and where ``curand.h`` comes from (``None``: FlashInfer's sampling module will not compile)."""

    path: str
    toolkit_root: str
    is_view: bool
    added: tuple[str, ...]
    curand_include: str | None

    def to_dict(self) -> dict:
        return dict(asdict(self), added=list(self.added))


@dataclass(frozen=True)
class ViewMeta:
    """A view's ``flashinfer_sm120_view.json``: what it was built for, what it adds, our stub's SHA-256
    (``None``: a link to the toolkit's own) and the builder's uid."""

    layout: int
    toolkit: str
    nvcc: str
    nvcc_full: str | None
    nvcc_fingerprint: list[int]
    curand_include: str | None
    added: tuple[str, ...]
    stub_sha256: str | None
    owner_uid: int

    def to_json(self) -> dict:
        return dict(asdict(self), added=list(self.added))

    @classmethod
    def from_json(cls, data: object, source: str = META_NAME) -> tuple[ViewMeta | None, str | None]:
        """``(meta, None)`` or ``(None, what is wrong)`` for decoded metadata (S2: typed, bounded fields)."""
        optional = (str, type(None))
        types = {"layout": int, "toolkit": str, "nvcc": str, "nvcc_full": optional, "nvcc_fingerprint": list,
                 "curand_include": optional, "added": list, "stub_sha256": optional, "owner_uid": int}
        try:
            if not isinstance(data, dict):
                return None, f"is a JSON {type(data).__name__}, not an object"
            if set(data) != set(types):
                return None, f"has keys {some(sorted(map(str, data)), 12)}, expected {sorted(types)}"
            got = {k: field(data, k, kind, source, max_len=4096) for k, kind in types.items()}
            fp, added = got["nvcc_fingerprint"], got["added"]
            if len(fp) != 5 or not all(isinstance(x, int) and not isinstance(x, bool) for x in fp):
                return None, f"has nvcc_fingerprint={shown(fp, 60)}, expected 5 integers"
            if not all(isinstance(a, str) and a in ADDED_ITEMS for a in added):
                return None, f"has added={shown(added, 80)}, expected items of {list(ADDED_ITEMS)}"
            if got["nvcc_full"] is not None:
                got["nvcc_full"] = str(parse_version(got["nvcc_full"], source))
        except FormatError as exc:
            return None, exc.problem
        return cls(**dict(got, added=tuple(added))), None


def _inside(path: str, roots: list[str]) -> bool:
    return any(r and (path == r or path.startswith(r.rstrip("/") + "/")) for r in roots)


def _walk_problem(path: str, meta: ViewMeta, roots: list[str]) -> str | None:
    files = {META_NAME} | ({STUB} if meta.stub_sha256 else set())
    for rel_dir in DIRS:
        d = os.path.join(path, rel_dir) if rel_dir else path
        try:
            st = os.lstat(d)
            names = os.listdir(d)
        except OSError as exc:
            return f"{d} cannot be read ({exc.strerror})"
        if not stat.S_ISDIR(st.st_mode):
            return f"{d} is not a directory"
        bad = mine_problem(d, st)
        if bad:
            return bad
        for name in names:
            rel = f"{rel_dir}/{name}" if rel_dir else name
            entry = os.path.join(d, name)
            try:
                est = os.lstat(entry)
            except OSError as exc:
                return f"{entry} cannot be read ({exc.strerror})"
            bad = mine_problem(entry, est)
            if bad:
                return bad
            if stat.S_ISLNK(est.st_mode):
                try:
                    target = os.path.normpath(os.path.join(d, os.readlink(entry)))
                except OSError as exc:
                    return f"{entry} cannot be read ({exc.strerror})"
                if not _inside(target, roots):
                    return f"{entry} points to {target}, outside the toolkit {meta.toolkit}"
            elif stat.S_ISDIR(est.st_mode) and rel in DIRS:
                continue
            elif not (stat.S_ISREG(est.st_mode) and rel in files):
                return f"{entry} is not a symlink into the toolkit (unexpected {stat.filemode(est.st_mode)})"
    return None


def check_view(path: str, toolkit: Toolkit, curand_inc: str | None) -> tuple[CudaHome | None, str | None]:
    """``(CudaHome, None)`` when the view at ``path`` may be adopted for ``toolkit`` and ``curand_inc``,
    else ``(None, why)`` naming the offending file (threat-model: P2).  Never raises for bad content."""
    uid = os.geteuid()
    meta_path = os.path.join(path, META_NAME)
    try:
        st = os.lstat(path)
    except OSError as exc:
        return None, f"{path} cannot be read ({exc.strerror})"
    if not stat.S_ISDIR(st.st_mode):
        return None, f"{path} is not a directory"
    data, problem = read_json(meta_path, max_bytes=64 << 10)
    if data is None:
        return None, problem or f"{meta_path} is missing"
    meta, problem = ViewMeta.from_json(data, meta_path)
    if meta is None:
        return None, f"{meta_path} {problem}"
    want = {"layout": VIEW_LAYOUT, "toolkit": toolkit.root, "nvcc": toolkit.nvcc,
            "nvcc_fingerprint": fingerprint(toolkit.nvcc), "curand_include": curand_inc, "owner_uid": uid}
    for key, value in want.items():
        if getattr(meta, key) != value:
            return None, (f"{meta_path} has {key}={shown(getattr(meta, key))}, this toolkit needs "
                          f"{shown(value)}")
    roots = [toolkit.root, *toolkit.include_dirs, toolkit.lib_dir or "", curand_inc or "", path]
    problem = _walk_problem(path, meta, roots)
    if problem:
        return None, problem
    for rel in REQUIRED:
        if not os.path.exists(os.path.join(path, rel)):
            return None, f"{os.path.join(path, rel)} is missing"
    if meta.stub_sha256:
        try:
            with open(os.path.join(path, STUB), "rb") as fh:
                digest = hashlib.sha256(fh.read(8 << 20)).hexdigest()
        except OSError as exc:
            return None, f"{os.path.join(path, STUB)} cannot be read ({exc.strerror})"
        if digest != meta.stub_sha256:
            return None, f"{os.path.join(path, STUB)} was changed after the view was built"
    return CudaHome(path, toolkit.root, True, meta.added, curand_inc), None
