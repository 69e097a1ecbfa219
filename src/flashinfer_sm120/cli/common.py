"""Helpers shared by the ``flashinfer-sm120`` subcommands."""

from __future__ import annotations

import re
import sys

from flashinfer_sm120.safety.formats.base import bounded


def err(msg: str) -> int:
    """Print ``flashinfer-sm120: error: <msg>`` on stderr (long runs of input cut); returns exit status 2."""
    print(f"flashinfer-sm120: error: {bounded(msg)}", file=sys.stderr)
    return 2


ARCH_HELP = ("compute capabilities to check for, e.g. '12.0' or '12.0 12.1' (the grammar of build --arch; "
             "default: FLASHINFER_CUDA_ARCH_LIST, else the GPUs present); sets FLASHINFER_CUDA_ARCH_LIST")


def apply_arch(value: str | None) -> None:
    """``--arch`` of every command, exported before anything resolves; ``UsageError`` when it is bad."""
    from flashinfer_sm120.core.facts.arch import ArchListError
    from flashinfer_sm120.core.facts.archopt import export_arch_list
    from flashinfer_sm120.errors import UsageError

    try:
        export_arch_list(value)
    except ArchListError as exc:
        raise UsageError(str(exc), fix="e.g. --arch 12.0") from None
    say_arch_notes(value)


def say_arch_notes(value: str | None) -> None:
    """Say on stderr how an ``--arch`` not written as FlashInfer's ``major.minor[a|f]`` list was read (``'120' read
    as 12.0``): the person sees what their value became (P8)."""
    from flashinfer_sm120.core.facts.arch import parse_arch_list_lenient

    specs, _errors = parse_arch_list_lenient(value or "", source="--arch")  # errors: said by export_arch_list
    listed = " ".join(f"{s.major}.{s.minor}{s.suffix or ''}" for s in specs)
    if not specs or listed == " ".join(re.split(r"[\s,;]+", value.strip())):
        return
    # FlashInfer 0.7.4 passes each target as -gencode=arch=compute_X,code=sm_X (compilation_context.py): no PTX
    dropped = (" (+PTX dropped: FlashInfer builds machine code only, code=sm_*, and embeds no PTX)"
               if "+PTX" in value.upper() else "")
    print(f"flashinfer-sm120: --arch {value!r} read as {listed}{dropped}", file=sys.stderr)
