"""What a view holds (:class:`ViewMeta`, the layout constants) and the check before one is adopted
(:func:`check_view`, P2); nothing here writes."""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import asdict, dataclass

from flashinfer_sm120.core.toolkit.model import CudaHome, Toolkit
from flashinfer_sm120.errors import FormatError
from flashinfer_sm120.safety.formats.base import shown, some
from flashinfer_sm120.safety.formats.grammar import parse_version
from flashinfer_sm120.safety.formats.fields import field
from flashinfer_sm120.safety.fs.atomic import read_json
from flashinfer_sm120.safety.ownership import fingerprint, mine_problem

#: Bumped whenever the view layout or metadata changes, so old views are not reused.
VIEW_LAYOUT = 3
META_NAME = "flashinfer_sm120_view.json"
#: The ``libcuda.so`` link stub (FlashInfer's ``-L$cuda_home/lib64/stubs -lcuda``).
STUB = "lib64/stubs/libcuda.so"
#: What a view may add to its toolkit.
ADDED_ITEMS = ("lib64/libcudart.so", STUB, "include/curand.h")
#: The real directories of a view ("" is the view itself); every other entry is a symlink.
DIRS = ("", "include", "lib64", "lib64/stubs")
#: What FlashInfer's build lines need from ``$cuda_home``.
REQUIRED = ("bin/nvcc", "include/cuda_runtime_api.h", "lib64/libcudart.so", STUB)


def lacks(home: str) -> list[str]:
    """What FlashInfer's build lines need from ``home`` that is not a regular file there: :data:`REQUIRED` (it links
    ``-L$cuda_home/lib64 -L$cuda_home/lib64/stubs -lcudart -lcuda``, 0.6 and 0.7 ``jit/cpp_ext.py``) and the
    ``include/curand.h`` its sampling module includes."""
    return [rel for rel in (*REQUIRED, "include/curand.h") if not os.path.isfile(os.path.join(home, rel))]


@dataclass(frozen=True)
class ViewMeta:
    """A view's metadata: what it was built for, what it adds, our stub's SHA-256 (``None``: a link to the
    toolkit's own) and the builder's uid."""

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
        if not isinstance(data, dict):
            return None, f"is a JSON {type(data).__name__}, not an object"
        if set(data) != set(types):
            return None, f"has keys {some(sorted(map(str, data)), 12)}, expected {sorted(types)}"
        try:
            got = {k: field(data, k, kind, source, max_len=4096) for k, kind in types.items()}
            if got["nvcc_full"] is not None:
                got["nvcc_full"] = str(parse_version(got["nvcc_full"], source))
        except FormatError as exc:
            return None, exc.problem
        fp, added = got["nvcc_fingerprint"], got["added"]
        if len(fp) != 5 or not all(type(x) is int for x in fp):
            return None, f"has nvcc_fingerprint={shown(fp, 60)}, expected 5 integers"
        if not all(isinstance(a, str) and a in ADDED_ITEMS for a in added):
            return None, f"has added={shown(added, 80)}, expected items of {list(ADDED_ITEMS)}"
        return cls(**dict(got, added=tuple(added))), None


def _walk_problem(path: str, meta: ViewMeta, roots: list[str]) -> str | None:
    """What in the view is not ours, not a real directory of :data:`DIRS`, not our stub or metadata, or a
    link that leads outside ``roots`` (P2)."""
    files = {META_NAME} | ({STUB} if meta.stub_sha256 else set())
    inside = tuple(r.rstrip("/") + "/" for r in roots if r)
    for rel_dir in DIRS:
        d = os.path.join(path, rel_dir) if rel_dir else path
        try:
            st = os.lstat(d)
            if not stat.S_ISDIR(st.st_mode):
                return f"{d} is not a directory"
            entries = [(d, st)] + [(os.path.join(d, n), os.lstat(os.path.join(d, n))) for n in os.listdir(d)]
            for entry, est in entries:
                bad = mine_problem(entry, est)
                if bad:
                    return bad
                rel = os.path.relpath(entry, path)
                if entry == d or (stat.S_ISDIR(est.st_mode) and rel in DIRS) or (
                        stat.S_ISREG(est.st_mode) and rel in files):
                    continue
                if not stat.S_ISLNK(est.st_mode):
                    return f"{entry} is not a symlink into the toolkit (unexpected {stat.filemode(est.st_mode)})"
                target = os.path.normpath(os.path.join(d, os.readlink(entry)))
                if not (target + "/").startswith(inside):
                    return f"{entry} points to {target}, outside the toolkit {meta.toolkit}"
        except OSError as exc:
            return f"{exc.filename} cannot be read ({exc.strerror})"
    return None


def check_view(path: str, toolkit: Toolkit, curand_inc: str | None) -> tuple[CudaHome | None, str | None]:
    """``(CudaHome, None)`` when the view at ``path`` may be adopted for ``toolkit`` and ``curand_inc``, else
    ``(None, why)`` naming the offending file (P2); never raises for bad content."""
    meta_path = os.path.join(path, META_NAME)
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return None, f"{path} is not a directory"
    except OSError as exc:
        return None, f"{path} cannot be read ({exc.strerror})"
    data, problem = read_json(meta_path, max_bytes=64 << 10)
    if data is None:
        return None, problem or f"{meta_path} is missing"
    meta, problem = ViewMeta.from_json(data, meta_path)
    if meta is None:
        return None, f"{meta_path} {problem}"
    want = {"layout": VIEW_LAYOUT, "toolkit": toolkit.root, "nvcc": toolkit.nvcc,
            "nvcc_fingerprint": fingerprint(toolkit.nvcc), "curand_include": curand_inc, "owner_uid": os.geteuid()}
    for key, value in want.items():
        if getattr(meta, key) != value:
            return None, f"{meta_path} has {key}={shown(getattr(meta, key))}, this toolkit needs {shown(value)}"
    roots = [toolkit.root, *toolkit.include_dirs, toolkit.lib_dir or "", curand_inc or "", path]
    problem = _walk_problem(path, meta, roots) or next(
        (f"{os.path.join(path, rel)} is missing" for rel in REQUIRED if not os.path.exists(os.path.join(path, rel))),
        None)
    if problem:
        return None, problem
    if meta.stub_sha256:
        try:
            with open(os.path.join(path, STUB), "rb") as fh:
                digest = hashlib.sha256(fh.read(8 << 20)).hexdigest()
        except OSError as exc:
            return None, f"{os.path.join(path, STUB)} cannot be read ({exc.strerror})"
        if digest != meta.stub_sha256:
            return None, f"{os.path.join(path, STUB)} was changed after the view was built"
    return CudaHome(path, toolkit.root, True, meta.added, curand_inc), None
