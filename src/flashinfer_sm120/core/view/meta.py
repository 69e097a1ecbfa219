"""What a view holds (:func:`want_meta`, the layout constants) and the check before one is adopted
(:func:`check_view`, P2); nothing here writes."""

from __future__ import annotations

import hashlib
import json
import os
import stat

from flashinfer_sm120.core.toolkit.model import CudaHome, Toolkit
from flashinfer_sm120.safety.formats.base import shown
from flashinfer_sm120.safety.fs.atomic import read_json
from flashinfer_sm120.safety.ownership import fingerprint, mine_problem

#: Bumped whenever the view layout or metadata changes, so old views are not reused.
VIEW_LAYOUT = 4
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
    """What of :data:`REQUIRED` (``-lcudart -lcuda`` from ``$cuda_home/lib64[/stubs]``, 0.6-0.7 ``jit/cpp_ext.py``)
    and the sampling module's ``include/curand.h`` is not a regular file in ``home``."""
    return [rel for rel in (*REQUIRED, "include/curand.h") if not os.path.isfile(os.path.join(home, rel))]


def want_meta(toolkit: Toolkit, curand_inc: str | None) -> dict:
    """What a view's metadata must hold for ``toolkit`` and ``curand_inc``; its view adds ``added`` and
    ``stub_sha256`` (our stub's SHA-256, ``None``: a link to the toolkit's own)."""
    return {"layout": VIEW_LAYOUT, "toolkit": toolkit.root, "nvcc": toolkit.nvcc,
            "nvcc_fingerprint": fingerprint(toolkit.nvcc), "curand_include": curand_inc, "owner_uid": os.geteuid()}


def _walk_problem(path: str, toolkit: str, stub_sha256: str | None, roots: list[str]) -> str | None:
    """What in the view is not ours, not a real directory of :data:`DIRS`, not our stub or metadata, or a
    link that leads outside ``roots`` (P2)."""
    files = {META_NAME} | ({STUB} if stub_sha256 else set())
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
                    return f"{entry} points to {target}, outside the toolkit {toolkit}"
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
    want = want_meta(toolkit, curand_inc)
    if not isinstance(data, dict) or set(data) != {*want, "added", "stub_sha256"}:
        return None, f"{meta_path} is not an object with the keys {sorted([*want, 'added', 'stub_sha256'])}"
    for key, value in want.items():  # compared as JSON: true is not 1, "3" is not 3 (S2)
        if json.dumps(data[key]) != json.dumps(value):
            return None, f"{meta_path} has {key}={shown(data[key])}, this toolkit needs {shown(value)}"
    added, sha = data["added"], data["stub_sha256"]
    if not isinstance(added, list) or not all(a in ADDED_ITEMS for a in added):
        return None, f"{meta_path} has added={shown(added, 80)}, expected items of {list(ADDED_ITEMS)}"
    roots = [toolkit.root, *toolkit.include_dirs, toolkit.lib_dir or "", curand_inc or "", path]
    problem = _walk_problem(path, toolkit.root, sha, roots) or next(
        (f"{os.path.join(path, rel)} is missing" for rel in REQUIRED if not os.path.exists(os.path.join(path, rel))),
        None)
    if problem:
        return None, problem
    if sha:
        try:
            with open(os.path.join(path, STUB), "rb") as fh:
                digest = hashlib.sha256(fh.read(8 << 20)).hexdigest()
        except OSError as exc:
            return None, f"{os.path.join(path, STUB)} cannot be read ({exc.strerror})"
        if digest != sha:
            return None, f"{os.path.join(path, STUB)} was changed after the view was built"
    return CudaHome(path, toolkit.root, True, tuple(added), curand_inc), None
