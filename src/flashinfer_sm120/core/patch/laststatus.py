"""The last statuses processes of this user reached, kept in ``<cache_root>/last-status.json`` so
that ``flashinfer-sm120 status`` answers without importing torch or FlashInfer.

The file holds up to :data:`KEEP` records, newest first, one per set of :func:`inputs` (everything
the resolution reads, without running anything: this Python, our version, the variables, the mtimes
of the ``sys.path`` directories, ``/usr/local`` and ``$CONDA_PREFIX``, every nvcc in sight, the GPUs
the driver lists), so ``status`` and ``status --arch 12.0`` each keep their answer.  A record is used
only when its inputs equal this process's and the chosen nvcc is unchanged; otherwise
:func:`flashinfer_sm120.core.patch.lastcheck.load` names, in words, what changed since the closest one.  Written once FlashInfer's import completed,
only when it changed; never raises.
"""

from __future__ import annotations

import os
import stat
import sys
from typing import Any, TypedDict

__all__ = ["SCHEMA", "FILE", "KEEP", "LastStatus", "from_status", "inputs", "records", "replay", "save", "path", "which_nvcc"]

SCHEMA = 2
FILE = "last-status.json"
#: Records kept (one per set of inputs: targets, environments).
KEEP = 8

#: Environment variables the resolution reads besides every ``FLASHINFER_*`` one.
_ENV = ("CUDA_HOME", "CUDA_PATH", "PATH", "CONDA_PREFIX", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES",
        "HOME", "XDG_CACHE_HOME", "SGLANG_CACHE_DIR")
#: Variables that do not change the answer (``status`` sets QUIET for itself) or change from one
#: shell to the next; every other one is part of the inputs (hashed: the file holds no values of them).
_IGNORED = frozenset(("FLASHINFER_SM120_QUIET", "FLASHINFER_SM120_RUN_ID", "FLASHINFER_JIT_VERBOSE", "PWD", "OLDPWD",
                      "SHLVL", "_", "COLUMNS", "LINES", "PS1", "PS2", "PROMPT_COMMAND", "TERM", "COLORTERM",
                      "SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY", "SSH_AUTH_SOCK", "DISPLAY", "TMUX_PANE",
                      "WINDOWID", "HISTFILE", "LS_COLORS", "LESSOPEN", "MAIL", "LOGNAME", "XDG_SESSION_ID"))


class LastStatus(TypedDict):
    """What ``status`` prints (``toolkit``: ``None`` when none fits)."""

    mode: str
    error: str | None
    toolkit: dict | None
    targets: list[str]
    arch_list_error: str | None
    flashinfer: str | None


def _mtime(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def _listing(path: str) -> list[str] | None:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return None


def _entry(path: str) -> list | None:
    """``path`` itself, a link not followed: its target, inode, size and mtime."""
    try:
        st = os.lstat(path)
        target = os.readlink(path) if os.path.islink(path) else None
    except OSError:
        return None
    return [target, st.st_ino, st.st_size, st.st_mtime_ns]


def _nvcc_entries(env: dict[str, str]) -> dict[str, list | None]:
    """The nvcc each place FlashInfer and we look at names (a ``$CUDA_HOME/bin/nvcc`` replaced by
    another release changes the answer, though the chosen nvcc did not change)."""
    out = {var: _entry(os.path.join(env[var], "bin", "nvcc")) for var in ("CUDA_HOME", "CUDA_PATH") if env.get(var)}
    if env.get("FLASHINFER_NVCC"):
        out["FLASHINFER_NVCC"] = _entry(env["FLASHINFER_NVCC"])
    on_path = which_nvcc(env)
    out["PATH"] = _entry(on_path) if on_path else None
    return out


def inputs(env: dict[str, str] | None = None) -> dict[str, Any]:
    """What the resolution in this process reads (see the module doc)."""
    from flashinfer_sm120 import __version__

    env = dict(os.environ if env is None else env)
    import hashlib

    names = sorted(k for k in env if k.startswith("FLASHINFER_") and k not in _IGNORED)
    rest = sorted((k, v) for k, v in env.items() if k not in _IGNORED and k not in _ENV and k not in names)
    # sys.path[0] is the script's directory or the working directory (python -m), unless -P/PYTHONSAFEPATH:
    # not where FlashInfer, torch or the CUDA wheels come from, and it differs between the console
    # script and ``python -m flashinfer_sm120``, which should share the record
    search = sys.path if sys.flags.safe_path else sys.path[1:]
    dirs = [p for p in dict.fromkeys(search) if p and os.path.isdir(p)]
    dirs += ["/usr/local"] + ([env["CONDA_PREFIX"]] if env.get("CONDA_PREFIX") else [])
    try:
        cuda_link = os.readlink("/usr/local/cuda")
    except OSError:
        cuda_link = None
    return {
        "python": [os.path.realpath(sys.executable), sys.prefix],  # bin/python and bin/python3 alike
        "version": __version__,
        "env": {k: env.get(k) for k in (*_ENV, *names)},
        "other_env": hashlib.sha256(repr(rest).encode("utf-8", "surrogateescape")).hexdigest(),
        "mtimes": {d: _mtime(d) for d in dirs},
        "usr_local_cuda": cuda_link,
        "nvcc": _nvcc_entries(env),
        "gpus": [_listing("/proc/driver/nvidia/gpus"), [n for n in (_listing("/dev") or []) if n.startswith("nvidia")]],
    }


def path() -> str:
    """Where the record lives (creates the cache root when absent)."""
    from flashinfer_sm120.safety.fs.statedir import cache_root

    return os.path.join(cache_root(), FILE)


def from_status(st: dict) -> LastStatus:
    """The part of :func:`flashinfer_sm120.status` that ``status`` prints."""
    res = st.get("resolution") or {}
    choice = res.get("choice") or {}
    tk = choice.get("toolkit") or None
    targets = st.get("target_cuda_archs")
    if targets is None:  # FlashInfer not loaded: the chosen ones
        targets = list(choice.get("targets") or ())
    return LastStatus(mode=str(st.get("mode")), error=st.get("error"),
                      toolkit={"nvcc_full": tk.get("nvcc_full"), "root": tk.get("root"), "nvcc": tk.get("nvcc")}
                      if tk else None,
                      targets=list(targets), arch_list_error=res.get("arch_list_error"),
                      flashinfer=(res.get("release") or {}).get("version"))


def save(status: LastStatus, recorded_inputs: dict[str, Any], res=None) -> None:
    """Record ``status`` for ``recorded_inputs`` (taken before FlashInfer changed the environment), with
    the resolution ``res`` of a patched or noop process for :func:`replay`."""
    try:
        from flashinfer_sm120.safety.fs.atomic import read_json, write_json_atomic
        from flashinfer_sm120.core.toolkit.memo import fingerprint

        st = dict(status)
        if st.get("toolkit"):
            st["toolkit"] = dict(st["toolkit"], stat=fingerprint(st["toolkit"]["nvcc"]))
        record = {"inputs": recorded_inputs, "status": st}
        if res is not None and res.choice is not None and status["mode"] in ("patched", "noop"):
            record["resolution"] = dict(res.to_dict(), own=res.own, nvcc_stat=fingerprint(res.choice.toolkit.nvcc))
        where = path()
        old, _ = read_json(where)
        kept = [r for r in records(old) if r["inputs"] != recorded_inputs][:KEEP - 1]
        data = {"schema": SCHEMA, "records": [record] + kept}
        if old != data:
            write_json_atomic(where, data)
    except Exception:  # a read-only HOME, a full disk: status takes the slow path
        pass


def replay(now: dict[str, Any]):
    """The :class:`~.resolve.Resolution` recorded for inputs equal to ``now``, else ``None`` (the caller
    resolves afresh: P1).  The file is read only when this uid owns it and no one else can write it
    (P2), through the bounded reader (P6); its nvcc must be unchanged, and it and the toolkit's
    directories pass the trust rule again (P2); its view is leased (P3) and checked as adoption checks it."""
    try:
        from flashinfer_sm120.core.facts.releases import release_info
        from flashinfer_sm120.core.patch.resolve import Resolution, flashinfer_version
        from flashinfer_sm120.core.toolkit.memo import fingerprint
        from flashinfer_sm120.safety.formats.reads import read_json_file
        from flashinfer_sm120.safety.fs.atomic import MAX_STATE_BYTES
        from flashinfer_sm120.safety.ownership import trust_reason
        from flashinfer_sm120.safety.trust import check_executable

        where, uid = path(), os.geteuid()
        st = os.lstat(where)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != uid or st.st_mode & 0o022:
            return None
        data = read_json_file(where, MAX_STATE_BYTES, follow=False, owners=(uid,))
        rec = next((r for r in records(data) if r["inputs"] == now and r.get("resolution")), None)
        if rec is None:
            return None
        d = rec["resolution"]
        res = Resolution.from_dict(d, release_info(flashinfer_version()), d["own"] is True)
        tk = res.choice.toolkit
        dirs = [tk.root, *tk.include_dirs, tk.lib_dir, res.home.curand_include]
        if fingerprint(tk.nvcc) != d["nvcc_stat"] or check_executable(tk.nvcc) is not None \
                or any(trust_reason(p, absent_ok=False) for p in dirs if p):
            return None
        if res.home.is_view:
            from flashinfer_sm120.core.view.meta import check_view
            from flashinfer_sm120.safety.fs import lease

            if not lease.hold(res.home.path):
                return None
            if check_view(res.home.path, tk, res.home.curand_include)[0] is None:
                lease.release(res.home.path)
                return None
        return res
    except Exception:  # no record, another shape, a read refused: resolve afresh
        return None


def records(data: Any) -> list[dict]:
    """The well-formed records of a file's ``data`` (none from another schema)."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("records"), list):
        return []
    return [r for r in data["records"] if isinstance(r, dict) and isinstance(r.get("inputs"), dict)
            and isinstance(r.get("status"), dict)]


def which_nvcc(env: dict[str, str]) -> str | None:
    """The nvcc on ``env``'s ``PATH``."""
    import shutil

    return shutil.which("nvcc", path=env.get("PATH") or os.defpath)
