"""Whether a record :mod:`~flashinfer_sm120.core.patch.laststatus` kept still holds for this process (for
``status`` and ``version``), and when none does, what changed, in words (P8)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from flashinfer_sm120.core.patch import laststatus

__all__ = ["Loaded", "load"]


@dataclass(frozen=True)
class Loaded:
    """The record, or ``None`` and why it cannot be used."""

    status: dict | None  # laststatus.from_status
    why_not: str | None = None


def load(env: dict[str, str] | None = None) -> Loaded:
    """The recorded status when it still holds for this process's inputs, else why not."""
    records, problem = laststatus.load()
    if problem:
        return Loaded(None, problem)
    now = laststatus.inputs(env)
    match = next((r for r in records if r["inputs"] == now), None)
    if match is None:
        closest = min(records, key=lambda r: len(_changes(r["inputs"], now, env)))
        return Loaded(None, "what the record was made from changed: " + "; ".join(_changes(closest["inputs"], now, env)))
    tk = match["status"].get("toolkit")
    from flashinfer_sm120.core.toolkit.memo import fingerprint

    if tk and fingerprint(tk.get("nvcc", "")) != tk.get("stat"):
        return Loaded(None, f"{tk.get('nvcc')} changed since it was recorded")
    return Loaded(match["status"])  # type: ignore[arg-type]


def _changes(old: dict, new: dict, env: dict[str, str] | None) -> list[str]:
    """What differs between two :func:`~.laststatus.inputs`, each in words a user can act on (P8)."""
    from flashinfer_sm120.safety.formats.base import MAX_WORD, shown as _shown

    def shown(value) -> str:  # paths whole, as people copy them; still bounded
        return _shown(value, limit=MAX_WORD)

    env = dict(os.environ if env is None else env)
    out: list[str] = []
    for var in sorted(set(old.get("env") or {}) | set(new["env"])):
        was, now = (old.get("env") or {}).get(var), new["env"].get(var)
        if was != now:
            out.append(f"{var} was unset, now {shown(now)}" if was is None else
                       f"{var} is now unset (was {shown(was)})" if now is None else
                       f"{var} changed from {shown(was)} to {shown(now)}")
    for place in sorted(set(old.get("nvcc") or {}) | set(new["nvcc"])):
        if (old.get("nvcc") or {}).get(place) != new["nvcc"].get(place):
            where = (laststatus.which_nvcc(env) if place == "PATH" else env.get(place, ""))
            if place in ("CUDA_HOME", "CUDA_PATH") and where:
                where = os.path.join(where, "bin", "nvcc")
            out.append(f"the nvcc found through {place} ({shown(where or 'none now')}) was replaced, added or removed")
    dirs = sorted(d for d in set(old.get("mtimes") or {}) | set(new["mtimes"])
                  if (old.get("mtimes") or {}).get(d) != new["mtimes"].get(d))
    if dirs:
        out.append(f"{shown(dirs[0])} changed (a package installed or removed)"
                   + (f", and {len(dirs) - 1} more directories" if len(dirs) > 1 else ""))
    words = {"python": lambda: f"another Python ({shown(new['python'][0])})",
             "version": lambda: f"flashinfer-sm120 is now {new['version']} (was {shown(old.get('version'))})",
             "other_env": lambda: "an environment variable not named above changed (values are not recorded)",
             "usr_local_cuda": lambda: f"/usr/local/cuda now points to {shown(new['usr_local_cuda'])} "
                                       f"(was {shown(old.get('usr_local_cuda'))})",
             "gpus": lambda: "the GPUs the driver lists changed"}
    out += [say() for key, say in words.items() if old.get(key) != new.get(key)]
    return out
