"""Where a command of ours must not import FlashInfer or build with it, and the fix (P2, P4, P8); creates nothing."""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING

from flashinfer_sm120.core.facts.workspace import WSB, workspace_path
from flashinfer_sm120.safety.formats.paths import foreign_tree
from flashinfer_sm120.safety.formats.base import shown

if TYPE_CHECKING:
    from flashinfer_sm120.safety.ownership import PlaceProblem


@dataclasses.dataclass(frozen=True)
class ImportRefusal:
    """Why a command of ours does not import FlashInfer here: ``code`` (a doctor finding's), ``text``, ``fix``."""

    code: str
    text: str
    fix: str

    def __str__(self) -> str:
        return f"FlashInfer was not imported: {self.text}. Fix: {self.fix}"


def _others_may_write(path: str) -> bool:
    from flashinfer_sm120.safety.ownership import writable_by_others

    try:
        return writable_by_others(os.stat(path))
    except OSError:
        return True


def import_refused(env=None) -> ImportRefusal | None:
    """Why our commands must not import FlashInfer here (P4): it would create the home directory, its cache
    in another uid's tree (``sudo -E``) or a place not ours, or write into a temporary directory not ours."""
    from flashinfer_sm120.safety.buildenv import temp_problem
    from flashinfer_sm120.safety.ownership import own_place_fix, trust_reason

    path, how = workspace_path()
    home = os.path.dirname(os.path.dirname(path))
    if how == "the home directory" and os.environ.get("HOME") == "":
        return ImportRefusal("workspace-no-home", f"HOME is set but empty, so FlashInfer would keep its JIT cache in "
                             f"{shown(path, 200)}, at the root of the file system",
                             f"set HOME to your home directory, or {WSB} to a directory of your own")
    if how == "the home directory" and not os.path.isdir(home):
        return ImportRefusal("workspace-no-home", f"its JIT cache {shown(path, 200)} lies in the home directory "
                             f"{shown(home, 200)}, which does not exist, and FlashInfer's import would create it",
                             f"set {WSB} to a directory of your own, or HOME to an existing one")
    why = trust_reason(path)
    ft = foreign_tree(path)
    # root about to make its cache in a user's tree no one else may write (sudo -E); otherwise
    # (another uid's directory anyone may write, a non-root user) the place rule's own reason
    if ft is not None and (why is None or (os.geteuid() == 0 and not _others_may_write(ft.top))):
        return ImportRefusal("workspace-foreign-tree",
                             f"its JIT cache {shown(path, 200)} would be created inside {ft.top}, owned by uid "
                             f"{ft.owner}, as uid {ft.uid}, and that user's own tools could not write it",
                             f"run as uid {ft.owner} (sudo -u), keep your own home (sudo -H instead of sudo -E), "
                             f"or set {WSB} to a directory of your own")
    if why:
        return ImportRefusal("workspace-not-ours", f"its JIT cache {shown(path, 200)} is not a place of yours: {why}",
                             own_place_fix())
    temp = temp_problem(os.environ if env is None else env)
    if temp is not None:
        return ImportRefusal("temp-not-ours", f"it and its dependencies write into {temp.role} {temp.program} "
                             f"({temp.found}), which fails the trust rule: {temp.why}", temp.fix)
    return None


def builds_refused(jit_dir: str, env=None) -> str | None:
    """Why every JIT build in ``jit_dir`` would be refused before nvcc runs: what ``build`` refuses by and
    ``status`` reports (P2, P8)."""
    from flashinfer_sm120.safety.buildenv import path_problem

    problem = jit_dir_refused(jit_dir) or path_problem(os.environ if env is None else env)
    return str(problem) if problem else None


def jit_dir_refused(jit_dir: str) -> str | PlaceProblem | None:
    """Why ``jit_dir`` is no place to build in (path rule, or ownership of a level, ``tmp`` included; P2, P4)."""
    from flashinfer_sm120.safety.formats.paths import jit_dir_problem
    from flashinfer_sm120.safety.ownership import check_place

    return jit_dir_problem(jit_dir) or check_place(os.path.join(jit_dir, "tmp"), "FlashInfer's JIT directory")
