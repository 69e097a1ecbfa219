"""The input boundary: everything flashinfer-sm120 reads that someone else could have written
enters here once and leaves as a typed value (threat-model: P2, P6).  Reads are capped while reading
and never wait on a FIFO; JSON depth is measured before parsing, ``NaN`` refused; one grammar per
kind of value; paths we write are joined by :func:`safe_join` and created by
:func:`make_private_dirs`; messages quote values cut by :func:`shown`.  Every refusal is a
:class:`FormatError` naming the source, the value (cut) and the fix.

This package exports what every process reads through (:mod:`.base`, :mod:`.reads`, :mod:`.grammar`,
:mod:`.paths`); parsers only commands need are imported from their module so ``import flashinfer``
loads none: :mod:`.flags`, :mod:`.params`, :mod:`.binary`, :mod:`.cli`, :mod:`.tar`.
"""
# threat-model: P2, P6 (outside input parsed once, at the edge, into typed values)

from __future__ import annotations

from flashinfer_sm120.errors import FormatError
from flashinfer_sm120.safety.formats.base import MAX_SHOWN, bounded, plural, printable, shown, some
from flashinfer_sm120.safety.formats.reads import (
    MAX_JSON_DEPTH, read_bytes, read_prefix, read_text, iter_lines, loads_json, read_json_file, field,
    env_text, check_text, string_list,
)
from flashinfer_sm120.safety.formats.grammar import (
    NAME_RE, FILE_NAME_RE, parse_version, parse_name, parse_relpath, parse_target, parse_flag,
    parse_path_text, parse_command_words, parse_sha256, parse_ninja_log_header, parse_leading_version,
)
from flashinfer_sm120.safety.formats.paths import PATH_RULE, ForeignTree, deepest_existing, foreign_tree, make_private_dirs, path_chars_problem, safe_join

__all__ = [
    "plural",
    "FormatError", "MAX_SHOWN", "MAX_JSON_DEPTH", "NAME_RE", "FILE_NAME_RE", "bounded", "printable", "shown", "some", "read_bytes",
    "read_prefix", "read_text", "iter_lines", "loads_json", "read_json_file", "field", "parse_version",
    "parse_name", "parse_relpath", "safe_join", "make_private_dirs", "PATH_RULE", "path_chars_problem",
    "ForeignTree", "foreign_tree", "deepest_existing", "env_text", "check_text", "parse_target",
    "parse_flag", "parse_path_text", "parse_command_words", "parse_sha256", "string_list",
    "parse_ninja_log_header", "parse_leading_version",
]
