import pytest

from flashinfer_sm120.core.facts import gpus
from flashinfer_sm120.core.toolkit.model import GPU

ALL = [GPU(0, "A", "GPU-aaaa-1111", (12, 0)), GPU(1, "B", "GPU-bbbb-2222", (9, 0)),
       GPU(2, "C", "GPU-cccc-3333", (12, 1))]


@pytest.mark.parametrize(
    "cvd, expected",
    [
        (None, [0, 1, 2]),
        ("", []),
        ("-1", []),
        ("1", [1]),
        ("2,0", [2, 0]),
        ("0,7,2", [0]),  # CUDA stops at the first invalid entry
        ("GPU-bbbb", [1]),
        ("GPU-cccc-3333,1", [2, 1]),
        ("MIG-GPU-aaaa-1111/1/0", [0]),
        ("MIG-0b4d7c3a-1111-2222-3333-444455556666", [0, 1, 2]),  # new form: keep all
        ("GPU-", []),  # ambiguous prefix is invalid
        ("1,1", [1]),
    ],
)
def test_cuda_visible_devices_semantics(cvd, expected):
    assert [g.index for g in gpus.select_visible(ALL, cvd)] == expected


def test_no_driver_means_no_gpus(monkeypatch):
    import pynvml

    def fail():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", fail)
    assert list(gpus.query().gpus) == []


def test_nvml_devices_read_without_cuda(monkeypatch):
    import pynvml

    caps = [(12, 0), (12, 1)]
    monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 2)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: i)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCudaComputeCapability", lambda h: caps[h])
    monkeypatch.setattr(pynvml, "nvmlDeviceGetName", lambda h: b"NVIDIA GeForce RTX 5090")
    monkeypatch.setattr(pynvml, "nvmlDeviceGetUUID", lambda h: f"GPU-{h}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    (g,) = list(gpus.query().gpus)
    assert g.capability == (12, 1) and g.name == "NVIDIA GeForce RTX 5090" and g.index == 1
