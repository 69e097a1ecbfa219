"""A doctor report built by hand, for rendering and diagnosis without a machine to collect it from."""


def doctor_report(**over) -> dict:
    """The report of a machine where everything fits (the shape of verify.report.collect)."""
    tk = {"root": "/opt/cu13", "nvcc": "/opt/cu13/bin/nvcc", "sources": ["pip"], "nvcc_full": "13.0.88"}
    r = {"flashinfer_sm120": "0.2.0", "python": "/venv/bin/python", "torch_version": "2.13.0", "torch_from": "/t",
         "torch_cuda": "13.0", "flashinfer_installed": True, "flashinfer": "0.7.4",
         "release": {"supported": True, "arch_rules": "r", "min_nvcc": None}, "gpu_source": "nvml",
         "gpus": [{"index": 0, "name": "NVIDIA GeForce RTX 5090", "capability": "12.0"}],
         "FLASHINFER_CUDA_ARCH_LIST": None, "settings": [],
         "candidates": [dict(tk, state="chosen", why="first", header_version="13.0", version_from="nvcc")],
         "resolution": {"choice": {"toolkit": tk, "targets": ["sm_120f"], "usable": []},
                        "cuda_home": {"path": "/opt/cu13", "is_view": False, "added": [], "curand_include": "/i"},
                        "arch_list_error": None},
         "before": {"cuda_home": "/opt/cu13", "cuda_version": "13.0", "target_cuda_archs": ["sm_120f"]},
         "after": {"status": {"mode": "patched", "steps": {}}, "jit_dir": "/j", "exported": {}},
         "autoload": {"pth": ["/venv/site/flashinfer_sm120_autoload.pth"]}, "disabled": False}
    r.update(over)
    return r
