# Stand-in written from SGLang 0.5.23 sglang/srt/server_args.py (ServerArgs.add_cli_args): the
# --sampling-backend option; --attention-backend comes from the dataclass field in
# sglang/srt/arg_groups/fields/exec_.py (add_cli_args_from_dataclass).
import argparse

from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES, SAMPLING_BACKEND_CHOICES


def add_cli_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--attention-backend", type=str, choices=ATTENTION_BACKEND_CHOICES, default=None)
    parser.add_argument(
        "--sampling-backend",
        type=str,
        choices=sorted(SAMPLING_BACKEND_CHOICES),
        default=None,
    )
    return parser
