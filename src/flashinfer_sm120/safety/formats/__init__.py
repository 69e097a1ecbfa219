"""The input boundary: everything flashinfer-sm120 reads that someone else could
have written enters here once and leaves as a typed value.

Rules, by construction rather than by listing bad cases:

* **bounded reads**: a size cap is enforced while reading (never "read, then
  check"); line reads stream with a per-line and a line-count cap; a FIFO or
  device is never opened for a blocking read;
* **depth-bounded JSON**: nesting is measured before :func:`json.loads` runs,
  so ``[[[[...`` ten thousand deep is refused with a message instead of a
  ``RecursionError``; ``NaN``/``Infinity`` are refused;
* **explicit types**: :func:`field` takes a key and the type wanted and says
  which file, which key and what it held;
* **one grammar per kind of value**: versions (:func:`parse_version`, parsed
  once into :class:`~packaging.version.Version` and only formatted from it),
  names (:data:`NAME_RE`: letters, digits, ``_``, ``.``, ``-``; no whitespace,
  ``$``, ``:``, ``/``, NUL), relative paths made of such names;
* **paths we write are checked where they are joined**: :func:`safe_join`
  refuses absolute parts, ``..`` and symlinked parents under the root;
  :func:`make_private_dirs` creates directories ``0700`` level by level,
  whatever the umask;
* **bounded messages**: :func:`shown` quotes at most :data:`MAX_SHOWN`
  characters of a value and :func:`some` at most a few items of a list.

Every refusal is a :class:`FormatError` (a :class:`~flashinfer_sm120.errors.Sm120Error`)
naming the file or variable, the offending value (truncated) and the fix.

Modules: :mod:`.base` (bounded messages), :mod:`.reads` (bounded reads, JSON, typed fields,
checked text), :mod:`.grammar` (one grammar per kind of value), :mod:`.paths` (safe joins,
private directories): what every process reads through, exported by this package.  The
parsers only some callers need are imported from their module, so that ``import flashinfer``
loads none it does not run: :mod:`.flags` (compile options), :mod:`.params` (a manifest's
FlashInfer generator and its parameters), :mod:`.binary` (ELF headers and tool output),
:mod:`.cli` (argparse number types).
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
