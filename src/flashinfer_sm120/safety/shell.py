"""Read a wrapper script's body as the POSIX shell would, for the subset a
wrapper needs, and list the commands it runs; refuse everything else.

This is an *allowlist*: the accepted grammar is the data below
(:data:`BUILTINS`, :data:`RESERVED`, :data:`SEPARATORS`, :data:`REDIRECTS`,
assignments to lower-case names only), and any other shape (a function, a
subshell, ``$(...)``, a here-document, ``${x:=...}``, ``eval``, ``cd``,
``PATH=...``) raises :class:`Refused` naming the line and the word.  Nothing
here decides trust: :mod:`.trust` follows every command listed.

Why not :mod:`shlex`: it is not the shell's lexer where it matters here.  It
starts a comment at a ``#`` inside a word (``echo a#b; /evil/x`` hides
``/evil/x``) and its comments swallow the newline that ends a command
(``echo hi # c`` + newline + ``/evil/x`` makes ``/evil/x`` an argument of
``echo``).  The lexer below follows POSIX.1-2017 XCU 2.3 "Token Recognition"
and 2.2 "Quoting" for the characters it accepts.
"""
# threat-model: P2 (a wrapper script is read, never run, to find what it would run)

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["BUILTINS", "RESERVED", "Refused", "Word", "Command", "commands"]

#: Builtins a wrapper may run: none runs a program, changes ``PATH`` or the
#: working directory, or assigns a variable (bash's ``printf -v`` and ``read``
#: do, so they are not here).
BUILTINS = frozenset({":", "true", "false", "echo", "test", "[", "exit", "shift", "wait", "set", "break",
                      "continue"})
#: Reserved words of the compound commands accepted (``if``/``while``/``until``
#: lists, ``for NAME in WORDS`` with a lower-case NAME, and ``case``); they run nothing themselves.
RESERVED = frozenset({"if", "then", "elif", "else", "fi", "while", "until", "do", "done", "!"})
#: Operators that end a command (``|``: each side is a command of its own).
SEPARATORS = frozenset({"\n", ";", "&", "&&", "||", "|"})
#: Redirections: each takes the next word as a file name (written or read, never run).
REDIRECTS = frozenset({"<", ">", ">>", ">&", "<&", "<>", ">|"})
#: Every operator the lexer knows, longest first (maximal munch, XCU 2.3 rule 2).
_OPERATORS = ("&&", "||", ";;", "<<", ">>", ">&", "<&", "<>", ">|", ";", "&", "|", "(", ")", "<", ">")
_OP_CHARS = frozenset("&|;<>()")
#: Parameters a word may expand (never in command position): ``$name``,
#: ``${name}``, ``$1`` ... ``$9`` and the special ``$@ $* $# $? $! $$ $- $0``.
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SPECIAL = frozenset("@*#?!$-0123456789")
#: Variables a wrapper may assign: lower-case names only.  Upper-case names are
#: the environment's (``PATH``, ``LD_PRELOAD``, ``IFS``, ``CUDA_HOME``) and an
#: assignment to an exported one changes what every later program runs.
_ASSIGNABLE = re.compile(r"[a-z_][a-z0-9_]*")


class Refused(Exception):
    """The script has a shape outside the accepted grammar; the message names the
    line and the word."""


@dataclass(frozen=True)
class Word:
    """One shell word.

    Attributes:
        text: the word with quotes removed; expansions kept as written (``$@``).
        expansions: the parameter expansions it holds, e.g. ``("$@",)``.
        glob: it holds an unquoted ``*``, ``?`` or ``[`` (pathname expansion).
        line: the line it starts on.
        raw: the word as written (quotes and all): an assignment or a reserved
            word counts only when written unquoted (``"PATH"=x`` is a command).
    """

    text: str
    expansions: tuple[str, ...] = ()
    glob: bool = False
    line: int = 1
    raw: str = ""

    @property
    def bare(self) -> bool:
        """Written without any quoting (so it can be a reserved word)."""
        return self.raw == self.text and self.literal

    @property
    def literal(self) -> bool:
        """Expands to exactly ``text`` (no parameter, no glob, no tilde)."""
        return not self.expansions and not self.glob


@dataclass(frozen=True)
class Command:
    """A simple command: ``words[0]`` is what runs; ``exec`` when run by ``exec``."""

    words: tuple[Word, ...]
    line: int
    exec: bool = False


def _cut(text: str, n: int = 60) -> str:
    return repr(text if len(text) <= n else text[:n] + "...")


class _Lexer:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.line = 1
        self.tokens: list[tuple[str, object, int]] = []  # ("op", str, line) | ("word", Word, line)

    def refuse(self, what: str) -> Refused:
        return Refused(f"line {self.line}: {what}")

    def run(self) -> list[tuple[str, object, int]]:
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if c == "\n":
                self.tokens.append(("op", "\n", self.line))
                self.line += 1
                self.i += 1
            elif c in " \t":
                self.i += 1
            elif c == "#":  # at the start of a word: a comment up to (not including) the newline
                end = s.find("\n", self.i)
                self.i = len(s) if end < 0 else end
            elif c in _OP_CHARS:
                op = next(o for o in _OPERATORS if s.startswith(o, self.i))
                self.tokens.append(("op", op, self.line))
                self.i += len(op)
            elif c == "\\" and s.startswith("\\\n", self.i):  # line continuation between words
                self.i += 2
                self.line += 1
            else:
                self.word()
        return self.tokens

    def expansion(self) -> str:
        """At a ``$``: the parameter it expands (``$@``), or ``""`` for a literal ``$``."""
        s, j = self.s, self.i + 1
        nxt = s[j] if j < len(s) else ""
        if nxt == "(":
            raise self.refuse("a command substitution '$(...)' or arithmetic '$((...))' computes the path "
                              "of the program it runs or a value")
        if nxt in ("'", '"'):
            raise self.refuse("$'...' or $\"...\" quoting is not part of the accepted grammar")
        if nxt == "{":
            end = s.find("}", j)
            inner = s[j + 1:end] if end > 0 else ""
            if end < 0 or not (_NAME.fullmatch(inner) or (len(inner) == 1 and inner in _SPECIAL)):
                raise self.refuse(f"the expansion {_cut(s[self.i:end + 1 if end > 0 else self.i + 20])} "
                                  f"(only ${{name}} is accepted: ${{x:=...}} assigns, ${{x:-...}} substitutes)")
            self.i = end + 1
            return "${" + inner + "}"
        m = _NAME.match(s, j)
        if m:
            self.i = m.end()
            return "$" + m.group()
        if nxt and nxt in _SPECIAL:
            self.i = j + 1
            return "$" + nxt
        self.i = j
        return ""

    def word(self) -> None:
        s, start_line = self.s, self.line
        text: list[str] = []
        exps: list[str] = []
        glob = bracket = False
        first = self.i
        while self.i < len(s):
            c = s[self.i]
            if c in " \t\n" or c in _OP_CHARS:
                break
            if c == "\\":
                if self.i + 1 >= len(s):
                    self.i += 1
                    break
                if s[self.i + 1] == "\n":  # continuation inside a word
                    self.line += 1
                else:
                    text.append(s[self.i + 1])
                self.i += 2
            elif c == "'":
                end = s.find("'", self.i + 1)
                if end < 0:
                    raise self.refuse("a single quote is not closed")
                part = s[self.i + 1:end]
                self.line += part.count("\n")
                text.append(part)
                self.i = end + 1
            elif c == '"':
                self.i += 1
                while True:
                    if self.i >= len(s):
                        raise self.refuse("a double quote is not closed")
                    d = s[self.i]
                    if d == '"':
                        self.i += 1
                        break
                    if d == "`":
                        raise self.refuse("a command substitution `...` computes what it runs")
                    if d == "\\" and self.i + 1 < len(s) and s[self.i + 1] in '$`"\\\n':
                        if s[self.i + 1] == "\n":
                            self.line += 1
                        else:
                            text.append(s[self.i + 1])
                        self.i += 2
                    elif d == "$":
                        e = self.expansion()
                        text.append(e or "$")
                        if e:
                            exps.append(e)
                    else:
                        if d == "\n":
                            self.line += 1
                        text.append(d)
                        self.i += 1
            elif c == "`":
                raise self.refuse("a command substitution `...` computes what it runs")
            elif c == "$":
                e = self.expansion()
                text.append(e or "$")
                if e:
                    exps.append(e)
            else:
                if c in "*?" or (c == "]" and bracket):
                    glob = True  # a lone '[' (the test builtin) is literal: only '[...]' is a pattern
                bracket = bracket or c == "["
                if c == "~" and self.i == first:
                    exps.append("~")
                text.append(c)
                self.i += 1
        value = "".join(text)
        # digits right before a redirection are its file descriptor (2>&1), not a word
        if value.isdigit() and not exps and self.i < len(s) and s[self.i] in "<>" and s[first].isdigit():
            return
        self.tokens.append(("word", Word(value, tuple(exps), glob, start_line, s[first:self.i]), start_line))


def commands(text: str) -> list[Command]:
    """The simple commands a script body runs, in order, each with its words.

    Only the accepted grammar is read (see the module docstring): simple
    commands, ``exec``, lower-case assignments, redirections, pipelines and
    ``&&``/``||``/``;``/``&`` lists, ``if``/``while``/``until`` and ``case``.
    A command word may be anything here; :mod:`.trust` decides which are
    allowed (a builtin of :data:`BUILTINS` or a literal absolute path).

    Raises:
        Refused: any other shape; the message names the line and the word.
    """
    if "\0" in text:
        raise Refused("line 1: the script holds a NUL byte")
    tokens = _Lexer(text).run()
    out: list[Command] = []
    modes: list[str] = []  # "pattern" / "body" for each open case
    i, n = 0, len(tokens)
    start = True  # at the start of a command

    def word_at(k: int) -> Word | None:
        return tokens[k][1] if k < n and tokens[k][0] == "word" else None  # type: ignore[return-value]

    while i < n:
        kind, val, line = tokens[i]
        if modes and modes[-1] == "pattern":  # case: patterns up to ')', then a list up to ';;'
            if kind == "op" and val == "\n":
                i += 1
                continue
            if kind == "word" and val.bare and val.text == "esac":  # type: ignore[union-attr]
                modes.pop()
                i += 1
                start = False
                continue
            j = i + (1 if kind == "op" and val == "(" else 0)
            while j < n and not (tokens[j][0] == "op" and tokens[j][1] == ")"):
                if tokens[j][0] == "op" and tokens[j][1] != "|":
                    raise Refused(f"line {tokens[j][2]}: {tokens[j][1]!r} in a case pattern")
                j += 1
            if j >= n:
                raise Refused(f"line {line}: a case pattern has no ')'")
            modes[-1] = "body"
            i, start = j + 1, True
            continue
        if kind == "op":
            if val in SEPARATORS:
                start = True
                i += 1
                continue
            if val == ";;" and modes and modes[-1] == "body":
                modes[-1] = "pattern"
                i += 1
                continue
            if val in REDIRECTS and word_at(i + 1) is not None:  # a redirection with no command word
                i += 2
                continue
            raise Refused(f"line {line}: {val!r} ({'a here-document' if val == '<<' else 'a subshell or function'}"
                          f" is not part of the accepted grammar)" if val in ("(", ")", "<<") else
                          f"line {line}: {val!r} is not part of the accepted grammar")
        w: Word = val  # type: ignore[assignment]
        if not start:
            raise Refused(f"line {line}: {_cut(w.text)} follows a compound command")
        if w.bare and w.text in RESERVED:
            i += 1
            start = w.text not in ("fi", "done")
            continue
        if w.bare and w.text == "for":
            var = word_at(i + 1)
            if var is None or not var.bare or not _ASSIGNABLE.fullmatch(var.text):
                raise Refused(f"line {line}: 'for' assigns {_cut(var.text if var else '')} (only lower-case "
                              f"names may be assigned)")
            i += 2
            kw = word_at(i)
            if kw is not None and kw.bare and kw.text == "in":
                i += 1
                while word_at(i) is not None:  # the words it iterates over: data, never run
                    i += 1
            continue
        if w.bare and w.text == "case":
            subject, kw = word_at(i + 1), word_at(i + 2)
            if subject is None or kw is None or kw.text != "in" or not kw.bare:
                raise Refused(f"line {line}: 'case' is not followed by WORD 'in'")
            modes.append("pattern")
            i += 3
            continue
        if w.bare and w.text == "esac" and modes and modes[-1] == "body":
            modes.pop()
            i, start = i + 1, False
            continue
        # a simple command: assignments and redirections, the command word, arguments
        words: list[Word] = []
        is_exec = False
        while i < n:
            kind, val, line = tokens[i]
            if kind == "op":
                if val in REDIRECTS:
                    target = word_at(i + 1)
                    if target is None:
                        raise Refused(f"line {line}: {val!r} has no file name")
                    i += 2
                    continue
                break
            w = val  # type: ignore[assignment]
            if not words and not is_exec and "=" in w.raw and _NAME.fullmatch(w.raw.split("=", 1)[0] or "-"):
                name = w.text.split("=", 1)[0]
                if not _ASSIGNABLE.fullmatch(name):
                    raise Refused(f"line {w.line}: assigns {name}= (an environment variable: it changes what "
                                  f"the programs it runs find and load)")
                i += 1
                continue
            if not words and not is_exec and w.literal and w.text == "exec":
                is_exec = True
                i += 1
                continue
            words.append(w)
            i += 1
        if words:
            out.append(Command(tuple(words), words[0].line, is_exec))
        start = False
    if modes:
        raise Refused(f"line {tokens[-1][2] if tokens else 1}: a 'case' is not closed by 'esac'")
    return out
