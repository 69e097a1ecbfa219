"""The last statuses this user's processes reached (``<cache_root>/last-status.json``, one per set of :func:`inputs`),
so that ``status`` answers and a later process replays the decision instead of probing again (:func:`replay`)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sys
from typing import Any, Callable

from flashinfer_sm120.core.facts.releases import release_info
from flashinfer_sm120.core.patch.state import Resolution, flashinfer_version
from flashinfer_sm120.errors import Sm120Error
from flashinfer_sm120.safety.formats.reads import MAX_STATE_BYTES, read_json_file
from flashinfer_sm120.safety.ownership import fingerprint, trust_reason

SCHEMA = 2
FILE = "last-status.json"
#: Records kept (one per set of inputs: targets, environments).
KEEP = 8

#: Environment variables the resolution reads besides every ``FLASHINFER_*`` one.
_ENV = ("CUDA_HOME", "CUDA_PATH", "PATH", "CONDA_PREFIX", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES",
        "HOME", "XDG_CACHE_HOME", "SGLANG_CACHE_DIR")
#: Variables that do not change the answer (``status`` sets QUIET for itself) or change from one
#: shell to the next; every other one is part of the inputs (hashed: the file holds no values of them).
_IGNORED = frozenset(("FLASHINFER_SM120_QUIET", "FLASHINFER_JIT_VERBOSE", "PWD", "OLDPWD",
                      "SHLVL", "_", "COLUMNS", "LINES", "PS1", "PS2", "PROMPT_COMMAND", "TERM", "COLORTERM",
                      "SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY", "SSH_AUTH_SOCK", "DISPLAY", "TMUX_PANE",
                      "WINDOWID", "HISTFILE", "LS_COLORS", "LESSOPEN", "MAIL", "LOGNAME", "XDG_SESSION_ID"))


def _or_none(read: Callable[[], Any]) -> Any:
    try:
        return read()
    except OSError:
        return None


def _entry(path: str) -> list | None:
    """``path`` itself, a link not followed: its target, inode, size and mtime."""
    st = _or_none(lambda: os.lstat(path))
    return st and [_or_none(lambda: os.readlink(path)), st.st_ino, st.st_size, st.st_mtime_ns]


def _nvcc_entries(env: dict[str, str]) -> dict[str, list | None]:
    """The nvcc each place FlashInfer and we look at names (another ``$CUDA_HOME/bin/nvcc`` changes the answer)."""
    out = {var: _entry(os.path.join(env[var], "bin", "nvcc")) for var in ("CUDA_HOME", "CUDA_PATH") if env.get(var)}
    if env.get("FLASHINFER_NVCC"):
        out["FLASHINFER_NVCC"] = _entry(env["FLASHINFER_NVCC"])
    on_path = which_nvcc(env)
    out["PATH"] = _entry(on_path) if on_path else None
    return out


def inputs(env: dict[str, str] | None = None) -> dict[str, Any]:
    """What the resolution reads: this Python, our version, the variables, the mtimes of the ``sys.path``
    directories, ``/usr/local`` and ``$CONDA_PREFIX``, every nvcc in sight, the GPUs the driver lists."""
    from flashinfer_sm120 import __version__

    env = dict(os.environ if env is None else env)
    names = sorted(k for k in env if k.startswith("FLASHINFER_") and k not in _IGNORED)
    rest = sorted((k, v) for k, v in env.items() if k not in _IGNORED and k not in _ENV and k not in names)
    # sys.path[0] is the script's directory or the working directory (python -m), unless -P/PYTHONSAFEPATH:
    # not where FlashInfer, torch or the CUDA wheels come from, and it differs between the console
    # script and ``python -m flashinfer_sm120``, which should share the record
    search = sys.path if sys.flags.safe_path else sys.path[1:]
    dirs = [p for p in dict.fromkeys(search) if p and os.path.isdir(p)]
    dirs += ["/usr/local"] + ([env["CONDA_PREFIX"]] if env.get("CONDA_PREFIX") else [])
    dev = _or_none(lambda: os.listdir("/dev")) or []
    return {
        "python": [os.path.realpath(sys.executable), sys.prefix],  # bin/python and bin/python3 alike
        "version": __version__,
        "env": {k: env.get(k) for k in (*_ENV, *names)},
        "other_env": hashlib.sha256(repr(rest).encode("utf-8", "surrogateescape")).hexdigest(),
        "mtimes": {d: _or_none(lambda d=d: os.stat(d).st_mtime_ns) for d in dirs},
        "usr_local_cuda": _or_none(lambda: os.readlink("/usr/local/cuda")),
        "nvcc": _nvcc_entries(env),
        "gpus": [_or_none(lambda: sorted(os.listdir("/proc/driver/nvidia/gpus"))),
                 sorted(n for n in dev if n.startswith("nvidia"))],
    }


def path() -> str:
    """Where the record lives (creates the cache root when absent)."""
    from flashinfer_sm120.safety.fs.statedir import cache_root

    return os.path.join(cache_root(), FILE)


def from_status(st: dict) -> dict:
    """What ``status`` prints of :func:`flashinfer_sm120.status` (``toolkit`` is ``None`` when none fits)."""
    res = st.get("resolution") or {}
    choice = res.get("choice") or {}
    tk = choice.get("toolkit") or None
    targets = st.get("target_cuda_archs")
    if targets is None:  # FlashInfer not loaded: the chosen ones
        targets = list(choice.get("targets") or ())
    return dict(mode=str(st.get("mode")), error=st.get("error"),
                toolkit={"nvcc_full": tk.get("nvcc_full"), "root": tk.get("root"), "nvcc": tk.get("nvcc")} if tk else None,
                targets=list(targets), arch_list_error=res.get("arch_list_error"),
                settings=list(res.get("settings") or ()),
                flashinfer=(res.get("release") or {}).get("version"))


def recheck(res) -> str | None:
    """Why a record of ``res`` is looked at again, not reused (P1, P8): it refused a toolkit whose nvcc is there for
    the files beside it (the trust rule, a missing header), which :func:`inputs` do not fingerprint, so their fix
    would change no input; a record keeps choices, not such refusals."""
    refused = [r.toolkit for r in (res.choice.rejected if res is not None and res.choice is not None else ())
               if r.refused and r.toolkit.problem
               and os.path.exists(os.path.join(r.toolkit.root, "bin", "nvcc"))]
    return f"{refused[0].label} was refused for its files, which may have been fixed since" if refused else None


def save(status: dict, recorded_inputs: dict[str, Any], res=None, export: dict | None = None) -> None:
    """Record ``status`` for ``recorded_inputs``, with a patched or noop process's ``res`` and ``export`` to replay."""
    with contextlib.suppress(Exception):  # a read-only HOME, a full disk: status takes the slow path
        st = dict(status)
        if st.get("toolkit"):
            st["toolkit"] = dict(st["toolkit"], stat=fingerprint(st["toolkit"]["nvcc"]))
        # an import that raised (EMFILE, a broken package) is said, not replayed: its inputs get no record
        record = [] if st.get("mode") == "failed" else [{"inputs": recorded_inputs, "status": st}]
        if record and (why := recheck(res)):
            record[0]["recheck"] = why
        elif record and res is not None and res.choice is not None and status["mode"] in ("patched", "noop"):
            record[0]["resolution"] = dict(res.to_dict(), own=res.own,
                                           nvcc_stat=fingerprint(res.choice.toolkit.nvcc),
                                           view_stat=fingerprint(res.home.path) if res.home.is_view else None,
                                           export=export or {})
        old = load()[0]
        kept = [r for r in old if r["inputs"] != recorded_inputs][:KEEP - 1]
        if old != record + kept:
            from flashinfer_sm120.safety.fs.atomic import write_json_atomic

            write_json_atomic(path(), {"schema": SCHEMA, "records": record + kept})


def load() -> tuple[list[dict], str | None]:
    """The records (their status shape is checked where one is shown: ``cli.status``), or ``[]`` and why none: only
    from a file this uid alone can write (P2), bounded (P6)."""
    try:
        where, uid = path(), os.geteuid()
        if not os.path.lexists(where):
            return [], "nothing recorded yet (FlashInfer was not imported with flashinfer-sm120 under these settings)"
        if os.lstat(where).st_mode & 0o022:
            return [], f"{where} is writable by others; remove it"
        data = read_json_file(where, MAX_STATE_BYTES, follow=False, owners=(uid,))
    except (OSError, Sm120Error) as exc:  # FormatError, StateFileError
        return [], f"the record cannot be read ({exc})"
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("records"), list):
        return [], "the record is of another format"
    records = [r for r in data["records"] if isinstance(r, dict) and isinstance(r.get("inputs"), dict)]
    return (records, None) if records else ([], f"{where} holds no record")


def _unchanged(program: str, stat: list | None) -> bool:
    """``program`` is the recorded binary (P1) and still passes the trust rule (P2); a script is traced again."""
    if stat is None or fingerprint(program) != stat or trust_reason(program, absent_ok=False):
        return False
    with open(program, "rb") as fh:
        if fh.read(2) != b"#!":
            return True
    from flashinfer_sm120.safety.trust import trace

    return trace(program).problem is None


def _export_unchanged(export: dict) -> bool:
    """The recorded ninja is still the one ``PATH`` finds and every ptxas asked is unchanged (``environ.export``)."""
    ninja, triton = export.get("ninja"), export.get("triton")
    if ninja is not None:
        found = shutil.which("ninja", path=ninja["dir"] or os.environ.get("PATH") or os.defpath)
        if not found or os.path.realpath(found) != ninja["real"] or not _unchanged(found, ninja["stat"]):
            return False
    return triton is None or (all(fingerprint(p) == fp for p, fp in triton["stat"].items())
                              and all(_unchanged(v, triton["stat"].get(v)) for v in triton["env"].values()))


def replay(now: dict[str, Any]) -> tuple[Any, dict] | None:
    """``(Resolution, export decisions)`` recorded for inputs equal to ``now``, else ``None`` (resolve afresh: P1); its
    nvcc, ninja and toolkit directories pass the trust rule again and its view is the one checked then (P2)."""
    try:
        rec = next((r for r in load()[0] if r["inputs"] == now and r.get("resolution")), None)
        if rec is None:
            return None
        d = rec["resolution"]
        res = Resolution.from_dict(d, release_info(flashinfer_version()), d["own"] is True)
        tk = res.choice.toolkit
        dirs = [tk.root, *tk.include_dirs, tk.lib_dir, res.home.curand_include]
        if not _unchanged(tk.nvcc, d["nvcc_stat"]) or any(trust_reason(p, absent_ok=False) for p in dirs if p) \
                or not _export_unchanged(d["export"]):
            return None
        if res.home.is_view and fingerprint(res.home.path) != d["view_stat"]:  # another directory there since
            return None
        return res, d["export"]
    except Exception:  # another shape, a read refused: resolve afresh
        return None


def which_nvcc(env: dict[str, str]) -> str | None:
    """The nvcc on ``env``'s ``PATH``."""
    return shutil.which("nvcc", path=env.get("PATH") or os.defpath)
