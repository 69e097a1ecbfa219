# Stand-in written from vLLM 0.33.0 vllm/engine/arg_utils.py: the --attention-backend option
# (EngineArgs.add_cli_args, "AttentionConfig" group), whose value names an AttentionBackendEnum
# member (vllm/config/attention.py validates it case-insensitively), and --moe-backend
# ("KernelConfig" group, a vllm/config/kernel.py MoEBackend).
import argparse


def add_cli_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    group = parser.add_argument_group(title="AttentionConfig")
    group.add_argument("--attention-backend", type=str.upper, default=None)
    kernel_group = parser.add_argument_group(title="KernelConfig")
    kernel_group.add_argument("--moe-backend", type=lambda s: s.lower().replace("-", "_"), default="auto")
    return parser
