"""Checks of what was built, as a user and an operator would ask them.

* :mod:`.targets`: which SASS/PTX target runs on which GPU (the rules, as data);
* :mod:`.inventory`: what FlashInfer will load (its JIT directory and the prebuilt
  ``flashinfer-jit-cache`` / ``flashinfer-cubin`` packages it prefers), with the
  targets in each module and a flag on every module the visible GPUs cannot run;
* :mod:`.links`: what a built ``.so`` is linked against (``NEEDED``/``RPATH`` read from
  its ELF file) and what it loaded at run time (``/proc/self/maps``);
* :mod:`.smoke`: ``flashinfer-sm120 doctor --smoke``, a tiny kernel compiled and linked
  with FlashInfer's own build line, run when a GPU is visible.

Nothing here patches anything; everything read from files and tools goes through
:mod:`flashinfer_sm120.safety.formats`.
"""
