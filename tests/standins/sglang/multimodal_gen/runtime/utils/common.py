# Stand-in written from SGLang 0.5.23 sglang/multimodal_gen/runtime/utils/common.py: its own
# set_cuda_arch() (called by the diffusion GPU worker, multimodal_gen/runtime/managers/gpu_worker.py)
# sets TORCH_CUDA_ARCH_LIST, which FlashInfer 0.7.x does not read.
import os


def set_cuda_arch():
    import torch

    if torch.cuda.is_available():
        capability = torch.cuda.get_device_capability()
        arch = f"{capability[0]}.{capability[1]}"
        os.environ["TORCH_CUDA_ARCH_LIST"] = f"{arch}{'+PTX' if arch == '9.0' else ''}"
