"""Manifest entries for modules built in this JIT workspace by the names ``build`` takes (``cache export
NAME...`` / ``--all``), so an export needs no recorded manifest: FlashInfer's own spec for each variant,
with the generator and parameters that made it noted as recording notes them
(:func:`flashinfer_sm120.core.jitenv.generators.capture`), encoded by :func:`flashinfer_sm120.core.jitenv.manifest.encode`.
"""

from __future__ import annotations

import contextlib

from flashinfer_sm120.core.jitenv import manifest
from flashinfer_sm120.warmup import session
from flashinfer_sm120.warmup import modules as _modules

__all__ = ["built_entries"]


@contextlib.contextmanager
def _capturing():
    """While active, every ``JitSpecNvcc`` made notes the FlashInfer generator and parameters that
    made it, as ``FLASHINFER_SM120_RECORD`` does (:mod:`flashinfer_sm120.core.jitenv.record`)."""
    from flashinfer.jit import core

    from flashinfer_sm120.core.jitenv.generators import capture

    cls = core.JitSpecNvcc
    original = cls.__dict__["__init__"]

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        capture(self)

    cls.__init__ = init
    try:
        yield
    finally:
        cls.__init__ = original


def built_entries(names: list[str], everything: bool, arch: str | None, *, head_dims=None, dtypes=None,
                  kv_dtypes=None, acts=None):
    """``(entries, skipped, session)``: an entry per variant of ``names`` (every name ``build`` knows
    when ``everything``, keeping those built here), and ``(name, why)`` for what cannot be exported.

    :raises ModuleError: an unknown name or variant flag.
    :raises BuildError: FlashInfer cannot be set up, or ``everything`` finds nothing built."""
    variants = _modules.expand(["all"] if everything else names, head_dims=head_dims, dtypes=dtypes,
                               kv_dtypes=kv_dtypes, acts=acts)
    session.apply_server_cache()  # the JIT dir the server installed here uses (SGLang's)
    sess = session.prepare(arch)
    entries, skipped, seen = [], [], set()
    with _capturing():
        for v in variants:
            try:
                spec = v.spec()
            except Exception as exc:  # FlashInfer refuses this combination here
                skipped.append((v.label, f"FlashInfer's {v.generator} raised {exc!r}"))
                continue
            if everything and not spec.jit_library_path.exists():
                continue  # --all: only what is built here
            entry = manifest.encode(spec, sess.flashinfer, sess.targets)
            if not entry.get("regenerable"):
                skipped.append((spec.name, entry.get("why", "")))
                continue
            entries.append(entry)
            seen.add(spec.name)
    if everything:
        for d in sorted(sess.jit_dir.iterdir()) if sess.jit_dir.is_dir() else ():
            if d.is_dir() and d.name not in seen and (d / f"{d.name}.so").exists():
                skipped.append((d.name, "built with parameters `build` does not name; record a manifest "
                                        "(FLASHINFER_SM120_RECORD) and export with --from"))
        if not entries:
            raise session.BuildError(f"nothing `build` can name is built in {sess.jit_dir} for "
                                     f"{' '.join(sess.targets)}; build it first (`flashinfer-sm120 build "
                                     f"--arch ... MODULE`) or give the same --head-dim/--dtype as the build")
    return entries, skipped, sess
