"""A stand-in jit-cache provider installed as a dist-info with entry_points.txt in a site directory."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from helpers.servers import STANDINS


def install_provider(site: Path, modules: list[str], *, archs=("sm120f",), version="0.7.4", shim="0.7.4",
                     tag="sm120f") -> Path:
    """``flashinfer-jit-cache`` ``shim`` (the stand-in package) and provider ``flashinfer-jit-cache-<tag>``
    ``version`` declaring ``archs`` and shipping an (empty) ``.so`` for each of ``modules``; returns ``site``."""
    site.mkdir(parents=True, exist_ok=True)
    if not (site / "flashinfer_jit_cache").exists():
        shutil.copytree(STANDINS / "precompiled" / "flashinfer_jit_cache", site / "flashinfer_jit_cache",
                        ignore=shutil.ignore_patterns("__pycache__"))
    for old in [*site.glob("flashinfer_jit_cache-*.dist-info"), *site.glob(f"flashinfer_jit_cache_{tag}-*.dist-info")]:
        shutil.rmtree(old)
    info = site / f"flashinfer_jit_cache-{shim}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: flashinfer-jit-cache\nVersion: {shim}\n")
    data = site / f"provider_{tag}_data"
    for m in modules:
        (data / m).mkdir(parents=True, exist_ok=True)
        (data / m / f"{m}.so").write_bytes(b"")
    declared = {"schema_version": 1, "distribution": f"flashinfer-jit-cache-{tag}", "version": version,
                "jit_cache_dir": str(data), "cuda_architectures": list(archs), "modules": modules}
    (site / f"provider_{tag}.py").write_text(f"import json\n\n\ndef provider():\n    return json.loads({json.dumps(json.dumps(declared))})\n")
    info = site / f"flashinfer_jit_cache_{tag}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: flashinfer-jit-cache-{tag}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[flashinfer.jit_cache.providers]\n{tag} = provider_{tag}:provider\n")
    return site
