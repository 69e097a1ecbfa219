# Stand-in written from vLLM 0.33.0 vllm/engine/arg_utils.py: the --attention-backend option
# (EngineArgs.add_cli_args, "AttentionConfig" group), whose value names an AttentionBackendEnum
# member (vllm/config/attention.py validates it case-insensitively).
import argparse


def add_cli_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    group = parser.add_argument_group(title="AttentionConfig")
    group.add_argument("--attention-backend", type=str.upper, default=None)
    return parser
