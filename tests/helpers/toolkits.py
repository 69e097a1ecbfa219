"""Fake CUDA toolkits and the executable scripts they (and fake compilers) are made of."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path


def script(path: Path, body: str = "#!/bin/sh\nexit 0\n") -> Path:
    """An executable file ``path`` holding ``body`` (its folders made as needed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body)
    path.chmod(0o755)
    return path


def make_toolkit(root: Path, version: str = "12.8.93", header: str | None = None, *,
                 nvcc_script: str | None = None, lib64: bool = True, curand: bool = False,
                 version_json: bool = False) -> Path:
    """A fake CUDA toolkit: ``bin/nvcc`` is a shell script printing ``version``."""
    mm = ".".join(version.split(".")[:2])
    (root / "bin").mkdir(parents=True)
    script(root / "bin" / "nvcc", nvcc_script or textwrap.dedent(f"""\
        #!/bin/sh
        echo "nvcc: NVIDIA (R) Cuda compiler driver"
        echo "Cuda compilation tools, release {mm}, V{version}"
        echo "Build cuda_{mm}.r{mm}"
        """))
    inc = root / "include"
    inc.mkdir()
    hmaj, hmin = (header or mm).split(".")[:2]
    (inc / "cuda_runtime_api.h").write_text(f"#define CUDART_VERSION {int(hmaj) * 1000 + int(hmin) * 10}\n")
    if curand:
        (inc / "curand.h").write_text("/* fake */\n")
    if lib64:
        (root / "lib64" / "stubs").mkdir(parents=True)
        (root / "lib64" / "libcudart.so").write_text("")
        (root / "lib64" / "stubs" / "libcuda.so").write_text("")
    if version_json:
        (root / "version.json").write_text(json.dumps({"cuda_nvcc": {"version": version}}))
    return root


def lying_toolkit(root, says="12.8.93", file_says="13.0.88", runs=None):
    """A toolkit whose bin/nvcc prints ``says`` while its version.json says ``file_says``; each run
    of nvcc appends a line to ``runs``."""
    mm = ".".join(says.split(".")[:2])
    count = f'echo x >> {runs}\n' if runs else ""
    script = (f'#!/bin/sh\n{count}echo "nvcc: NVIDIA (R) Cuda compiler driver"\n'
              f'echo "Cuda compilation tools, release {mm}, V{says}"\n')
    make_toolkit(root, says, header=".".join(file_says.split(".")[:2]), nvcc_script=script, curand=True)
    (root / "version.json").write_text(json.dumps({"cuda_nvcc": {"version": file_says}}))
    return root


def compiled(path: Path, c_source: str) -> Path:
    """An executable ``path`` compiled from ``c_source`` (with /usr/bin/gcc): a test double that
    decides at run time (reads its arguments or environment) cannot be a script, since a wrapper
    script that computes a word is refused (docs/safety.md section 2)."""
    import subprocess

    path.parent.mkdir(parents=True, exist_ok=True)
    src = path.parent / (path.name + ".c")
    src.write_text(c_source)
    if path.exists():
        path.unlink()
    subprocess.run(["/usr/bin/gcc", "-O1", "-o", str(path), str(src)], check=True, capture_output=True)
    return path
