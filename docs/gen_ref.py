"""Reference tables generated from the code, so that the docs cannot drift from it.

The generated text is committed in the pages, between ``<!-- gen:NAME -->`` and
``<!-- /gen:NAME -->`` (so the pages read whole in the repository), and this file is its one
source.  Used three ways:

* ``python docs/gen_ref.py`` rewrites every page's generated blocks from the code (a bare
  ``<!-- gen:NAME -->`` becomes a filled block);
* from the tests: :func:`render` gives a page with fresh blocks, and a page that differs from
  it is stale (``tests/project/test_docs.py``);
* as a MkDocs hook (``hooks: [docs/gen_ref.py]`` in ``mkdocs.yml``): the site shows fresh
  blocks, without the markers.

Sources: ``flashinfer_sm120.envvars.VARIABLES`` (environment variables),
``flashinfer_sm120.cli.build_parser()`` (the CLI), ``flashinfer_sm120.core.facts.releases``
(FlashInfer releases), ``flashinfer_sm120.core.facts.arch.MIN_NVCC`` (targets), and the
docstrings of the public API.
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "src") not in sys.path:  # build the docs of this checkout, installed or not
    sys.path.insert(0, str(ROOT / "src"))

MARKER = re.compile(r"<!-- gen:([a-z_]+) -->")


def _cell(text: str) -> str:
    """Table-cell text: no newlines or pipes, and ``<...>`` outside code spans shown, not parsed."""
    parts = str(text).replace("\n", " ").replace("|", "\\|").split("`")
    for i in range(0, len(parts), 2):  # outside backticks
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;").replace("_", "\\_").replace("*", "\\*")
    return "`".join(parts)


def _table(head: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


# --------------------------------------------------------------------------- environment


_AUDIENCE = {"user": "Set by you", "tests": "Read by the test suite only"}


def envvars() -> str:
    """Every ``FLASHINFER_SM120_*`` variable, grouped by who sets it."""
    from flashinfer_sm120 import envvars as ev

    out = []
    for audience, title in _AUDIENCE.items():
        rows = [[f"`{v.name}`", v.default, v.effect] for v in ev.VARIABLES if v.audience == audience]
        if rows:
            out += [f"### {title}", "", _table(["Variable", "Default", "Effect"], rows), ""]
    unknown = {v.audience for v in ev.VARIABLES} - set(_AUDIENCE)
    if unknown:
        raise ValueError(f"envvars.VARIABLES uses audiences the docs do not know: {sorted(unknown)}")
    return "\n".join(out).rstrip()


# --------------------------------------------------------------------------- CLI


def _option_cell(action: argparse.Action) -> str:
    flags = ", ".join(f"`{o}`" for o in action.option_strings) or f"`{action.metavar or action.dest}`"
    if action.nargs == 0:
        return flags
    if action.choices and not isinstance(action, argparse._SubParsersAction):
        return flags + " {" + ",".join(map(str, action.choices)) + "}"
    meta = action.metavar or (action.dest.upper() if action.option_strings else None)
    return flags + (f" `{meta}`" if meta and action.option_strings else "")


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    text = parser._get_formatter()._expand_help(action) if action.help else ""
    if action.default not in (None, False, argparse.SUPPRESS) and action.option_strings \
            and "default" not in text:
        text += f" (default: {action.default})"
    return text


def _subcommands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) in seen:  # an alias of a subcommand already listed
                    continue
                seen.add(id(sub))
                yield path + (name,), sub, helps.get(name)
                yield from _subcommands(sub, path + (name,))


def cli() -> str:
    """Every subcommand of ``flashinfer-sm120`` with its usage and options, from the parser."""
    from flashinfer_sm120.cli import build_parser

    parser = build_parser()
    out = []
    for path, sub, summary in _subcommands(parser):
        has_sub = any(isinstance(a, argparse._SubParsersAction) for a in sub._actions)
        out += [f"### `flashinfer-sm120 {' '.join(path)}`", ""]
        if summary:
            out += [summary[0].upper() + summary[1:] + ".", ""]
        if sub.description and sub.description != summary:
            out += [sub.description, ""]
        usage = " ".join(sub.format_usage().split())
        out += ["```", usage, "```", ""]
        rows = [[_option_cell(a), _help(sub, a)] for a in sub._actions
                if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]
        if rows:
            out += [_table(["Argument", "What it does"], rows), ""]
        elif has_sub:
            out += ["Subcommands: see below.", ""]
    return "\n".join(out).rstrip()


# --------------------------------------------------------------------------- releases and targets


def releases() -> str:
    """The FlashInfer release table (``flashinfer_sm120.core.facts.releases.RELEASES``)."""
    from flashinfer_sm120.core.facts import releases as rel

    rows = [[f"< {min(s.version for s in rel.SUPPORTED)}", "unsupported", "not patched", "", ""]]
    for spec, row in rel.RELEASES:
        bounds = sorted(spec, key=lambda s: s.operator != ">=")  # lower bound first
        rows.append([f"`{','.join(map(str, bounds))}`", f"`{row['era']}`", row["arch_rules"],
                     str(row.get("min_nvcc") or "none"), row["workspace"]])
    table = _table(["FlashInfer", "Era", "Arch rules (flashinfer/compilation_context.py)",
                    "Minimum nvcc for its own flags", "JIT workspace"], rows)
    return table + f"\n\nChecked against FlashInfer releases up to {rel.TESTED_UP_TO}; newer ones use the last row."


def targets() -> str:
    """Minimum nvcc per target (``flashinfer_sm120.core.facts.arch.MIN_NVCC``)."""
    from flashinfer_sm120.core.facts import arch

    by_release: dict[str, list[str]] = {}
    for target, version in arch.MIN_NVCC.items():
        by_release.setdefault(str(version), []).append(f"sm_{target}")
    def key(name: str) -> tuple:
        m = re.match(r"sm_(\d+)(\w*)", name)  # numeric order: sm_90a before sm_100a
        return (int(m.group(1)), m.group(2)) if m else (0, name)

    rows = [[", ".join(f"`{n}`" for n in sorted(names, key=key)), release] for release, names in
            sorted(by_release.items(), key=lambda kv: tuple(int(x) for x in kv[0].split(".")))]
    return _table(["Targets", "Minimum nvcc"], rows)


# --------------------------------------------------------------------------- Python API


#: ``(import path, object path)`` of the documented public API.
API = (("flashinfer_sm120", "install"), ("flashinfer_sm120", "revert"), ("flashinfer_sm120", "status"),
       ("flashinfer_sm120", "resolve"), ("flashinfer_sm120.core.jitenv.environ", "exported"),
       ("flashinfer_sm120", "worker_setup"))


def _docstring(obj) -> str:
    """A Google-style docstring as Markdown (sections as bold labels, not code blocks)."""
    text = inspect.cleandoc(obj.__doc__ or "")
    text = re.sub(r":(?:func|class|data|mod|meth|attr):`~?([^`]+)`", r"`\1`", text).replace("``", "`")
    out: list[str] = []
    section = None
    for line in text.splitlines():
        m = re.match(r"^(Args|Arguments|Returns|Raises|Attributes|Yields):\s*$", line)
        if m:
            section = m.group(1)
            out += ["", f"**{section}:**", ""]
            continue
        if section and line.startswith("    "):
            body = line.strip()
            item = re.match(r"^(\w+): (.*)$", body) if section in ("Args", "Arguments", "Raises") else None
            if item and not line.startswith("        "):
                out.append(f"- `{item.group(1)}`: {item.group(2)}")
            elif out and out[-1]:
                out[-1] += " " + body
            else:
                out.append(body)
            continue
        section = None if line.strip() else section
        out.append(line)
    return "\n".join(out).strip()


def api() -> str:
    """Signature and docstring of each entry of :data:`API`."""
    import importlib

    out = []
    for module, name in API:
        obj = getattr(importlib.import_module(module), name)
        try:
            sig = str(inspect.signature(obj)).replace("'", "")
        except (TypeError, ValueError):
            sig = "(...)"
        out += [f"### `{module}.{name}{sig}`", "", _docstring(obj), ""]
    return "\n".join(out).rstrip()


def build_list() -> str:
    """What ``flashinfer-sm120 build --list`` prints, as a code block (the named modules)."""
    from flashinfer_sm120.warmup import modules

    return "```\n$ flashinfer-sm120 build --list\n" + modules.describe_all() + "\n```"


GENERATORS: dict[str, Callable[[], str]] = {
    "envvars": envvars, "cli": cli, "releases": releases, "targets": targets, "api": api,
    "build_list": build_list,
}


#: A generated block as committed (group 2 is the text between the markers), or a bare marker.
BLOCK = re.compile(r"<!-- gen:([a-z_]+) -->(?:\n(.*?)\n<!-- /gen:\1 -->)?", re.S)


def render(markdown: str) -> str:
    """``markdown`` with every generated block filled afresh from the code (markers kept);
    an unknown NAME raises ``KeyError``."""
    def one(m: re.Match) -> str:
        name = m.group(1)
        if name not in GENERATORS:
            raise KeyError(f"unknown docs generator {name!r}; known: {', '.join(GENERATORS)}")
        return f"<!-- gen:{name} -->\n{GENERATORS[name]()}\n<!-- /gen:{name} -->"

    return BLOCK.sub(one, markdown)


def pages(docs: Path = ROOT / "docs") -> list[Path]:
    """The pages that hold a generated block."""
    return sorted(p for p in docs.rglob("*.md") if MARKER.search(p.read_text(encoding="utf-8")))


def on_page_markdown(markdown: str, **kwargs) -> str:
    """MkDocs hook: the page as the site shows it (fresh blocks, no markers)."""
    return re.sub(r"<!-- /?gen:[a-z_]+ -->\n?", "", render(markdown))


def main() -> int:
    """Rewrite the generated blocks of every page; prints the pages changed."""
    for page in pages():
        text = page.read_text(encoding="utf-8")
        fresh = render(text)
        if fresh != text:
            page.write_text(fresh, encoding="utf-8")
            print(f"rewrote {page.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
