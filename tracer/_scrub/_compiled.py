"""The compiled gate: one Hyperscan pass over a text tells which regular-expression rules may
match in it at all; the others are not run.

Each rule's expression is rewritten to a superset of itself that Hyperscan compiles (every
match of the rule is a match of the rewrite): lookarounds are dropped, repeats bounded above 32
are left unbounded, ``{,n}`` (a repeat in Python, literal text in Hyperscan) becomes ``{0,n}``,
and, for a rule searched in windows of the text (where the window's end passes for the text's
end), the end assertions ``$`` and ``\\Z`` are dropped too. Hyperscan's prefilter mode widens
what is left that it cannot run exactly. An expression that still does not compile, or holds a
construct the rewrite does not read, is left out of the database, and its rule always runs. A
rule is skipped only when its rewrite matches nowhere in the whole text, so what the scrubber
finds is the same with and without the gate.

Hyperscan reads ASCII as Python does, but for ``\\s`` (Python's takes ``\\x1c``-``\\x1f``):
every character other than ASCII is replaced by ``\\x1a`` in the text the gate reads, and
every atom of an expression that may match such a character (``.``, ``\\w``, a class, a
character other than ASCII, a letter Python takes for one when case is ignored) is widened to
match ``\\x1a``; the word boundaries ``\\b`` and ``\\B`` are dropped. A text that holds
``\\x1a`` or ``\\x1c``-``\\x1f`` runs every rule, as without the gate.

Compiling the database takes seconds; it is done on a thread of its own, the first time a
scrubber needs it, and the result is kept in the user's cache directory
(``$RECALLTRACE_CACHE_DIR``, else ``$XDG_CACHE_HOME/recalltrace``, else
``~/.cache/recalltrace``) under a hash of the expressions, their flags and Hyperscan's version,
so that the next process loads it in about a tenth of a second. A cache that cannot be read
or written is compiled around; until the database is ready every rule runs.
"""

from __future__ import annotations

import codecs
import hashlib
import importlib
import json
import logging
import os
import re
import tempfile
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger("recalltrace.tracer")

# ``hyperscan``'s module, imported when a gate is first built; ``None`` when not installed.
hyperscan: Any = False

Spec = tuple[str, int, bool]
"""An expression, its ``re`` flags, and whether it is searched in windows of the text."""

_REPEAT = re.compile(r"\{(\d*)(?:(,)(\d*))?\}")
_LARGEST_BOUND = 32
SHORTEST = 8192
"""Texts shorter than this are not gated: the scan costs more than the rules it skips."""
FEWEST = 8
"""Nor are texts in which fewer rules of the database pass their own gates."""
_FORMAT = b"recalltrace-scrub-gate 1\n"
counts = {"compiled": 0, "loaded": 0}
"""Databases compiled and loaded from the cache in this process (for tests)."""


def available() -> bool:
    global hyperscan
    if hyperscan is False:
        try:
            hyperscan = importlib.import_module("hyperscan")
        except ImportError:
            hyperscan = None
    return hyperscan is not None


def readable(view: str) -> bool:
    """Whether the gate can read ``view``: it holds none of the four separator characters
    that only Python's ``\\s`` takes, nor ``_OTHER``."""
    return (
        "\x1a" not in view
        and "\x1c" not in view
        and "\x1d" not in view
        and "\x1e" not in view
        and "\x1f" not in view
    )


def _group_end(pattern: str, start: int) -> int:
    """The index just past the group opening at ``start``."""
    depth = 0
    index = start
    size = len(pattern)
    while index < size:
        char = pattern[index]
        if char == "\\":
            index += 2
            continue
        if char == "[":
            index = _class_end(pattern, index)
            continue
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0:
                return index + 1
        index += 1
    return size


def _class_end(pattern: str, start: int) -> int:
    """The index just past the character class opening at ``start``."""
    index = start + 1
    if pattern[index : index + 1] == "^":
        index += 1
    if pattern[index : index + 1] == "]":
        index += 1
    while index < len(pattern) and pattern[index] != "]":
        index += 2 if pattern[index] == "\\" else 1
    return index + 1


_REPEATS = ("?", "*", "+", "{")
_OTHER = "\x1a"
"""What every character but ASCII becomes in the text the gate reads (the text must not hold
it itself); every atom of an expression that may match such a character matches it."""
_OTHER_CLASS = "\\x1a"
# The ASCII letters that Python's case-insensitive matching takes for a character other than
# ASCII ("K" for the Kelvin sign, "s" for the long s, "i" for the dotted capital I).
_FOLDING = frozenset("iksIKS")
_WIDENED = {"\\w": "[\\w\\x1a]", "\\d": "[\\d\\x1a]", "\\s": "[\\s\\x1a]"}


def _replace_other(error: UnicodeError) -> tuple[str, int]:
    assert isinstance(error, UnicodeEncodeError)
    return _OTHER * (error.end - error.start), error.end


codecs.register_error("recalltrace-gate", _replace_other)
_GROUP_OPENING = re.compile(r"\(\?(?:[:>]|P<\w+>|<\w+>|[aiLmsux-]+[:)]|#[^)]*\))")


def superset(pattern: str, window: bool) -> str | None:
    """A rewrite of ``pattern`` (Python syntax) that Hyperscan reads as matching at least what
    Python's ``re`` matches, in a text whose characters other than ASCII are each replaced by
    ``_OTHER``; ``None`` when it holds a construct this does not read (a back-reference, an
    escape naming a character by its code point, a repeated assertion, a POSIX class)."""
    out: list[str] = []
    index = 0
    size = len(pattern)
    while index < size:
        char = pattern[index]
        if char == "\\":
            escape = pattern[index : index + 2]
            index += 2
            letter = escape[1:]
            if letter in ("b", "B") or (window and letter in ("Z", "z")):
                # Dropped: a word boundary next to a character replaced reads differently.
                if pattern[index : index + 1] in _REPEATS:
                    return None
            elif letter.isdigit() or letter in ("u", "U", "N"):
                return None
            elif letter == "x":
                code = pattern[index : index + 2]
                index += 2
                out.append(_literal(chr(int(code, 16))))
            else:
                out.append(_WIDENED.get(escape, escape))
        elif char == "[":
            end = _class_end(pattern, index)
            body = pattern[index:end]
            inner = body[1:]
            if "[:" in inner or "[." in inner or "[=" in inner or "\\u" in body or "\\N" in body:
                return None
            if body.startswith("[^"):
                out.append(f"(?:{body}|{_OTHER_CLASS})")
            else:
                extra = _OTHER_CLASS
                if not body.isascii() or "\\x" in body or "\\U" in body:
                    extra += "iksIKS"
                first = 2 if body.startswith("[]") else 1  # a class may open with "]"
                out.append(body[:first] + extra + body[first:])
            index = end
        elif char == "(" and pattern.startswith(("(?=", "(?!", "(?<=", "(?<!"), index):
            index = _group_end(pattern, index)
            if pattern[index : index + 1] in _REPEATS:
                return None
        elif char == "(" and pattern.startswith("(?", index):
            opening = _GROUP_OPENING.match(pattern, index)
            if opening is None:
                return None  # a conditional or a named back-reference
            out.append(opening.group())
            index = opening.end()
        elif char == "$" and window:
            index += 1
            if pattern[index : index + 1] in _REPEATS:
                return None
        elif char == "{" and (repeat := _REPEAT.match(pattern, index)) is not None:
            low, comma, high = repeat.groups()
            if not low and not comma:
                out.append("\\{\\}")  # literal in Python
            else:
                lower = int(low or 0)
                upper = lower if comma is None else (int(high) if high else None)
                if upper is not None and upper < lower:
                    return None
                if upper is None or upper > _LARGEST_BOUND or lower > _LARGEST_BOUND:
                    out.append(f"{{{min(lower, _LARGEST_BOUND)},}}")
                else:
                    out.append(f"{{{lower},{upper}}}")
            index = repeat.end()
        elif char in _FOLDING or not char.isascii():
            out.append(_literal(char))
            index += 1
        else:
            out.append(char)
            index += 1
    return "".join(out)


def _literal(char: str) -> str:
    """An expression of the character ``char`` that also matches what it may stand for in
    the text the gate reads (``_OTHER``, and an ASCII letter it may be taken for)."""
    if char.isascii() and char not in _FOLDING:
        return char if char.isalnum() else f"\\x{ord(char):02x}"
    folds = "".join(
        letter
        for letter in "iksIKS"
        if letter != char and re.fullmatch(re.escape(char), letter, re.IGNORECASE)
    )
    return f"[{re.escape(char) if char.isascii() else ''}{folds}{_OTHER_CLASS}]"


def _hs_flags(flags: int) -> int:
    result = hyperscan.HS_FLAG_SINGLEMATCH | hyperscan.HS_FLAG_UTF8 | hyperscan.HS_FLAG_PREFILTER
    if flags & re.IGNORECASE:
        result |= hyperscan.HS_FLAG_CASELESS
    if flags & re.MULTILINE:
        result |= hyperscan.HS_FLAG_MULTILINE
    if flags & re.DOTALL:
        result |= hyperscan.HS_FLAG_DOTALL
    return result


def _expressions(specs: Sequence[Spec]) -> list[tuple[int, bytes, int]]:
    """(index, rewritten expression, Hyperscan flags) of each spec that has a rewrite."""
    out = []
    for index, (pattern, flags, window) in enumerate(specs):
        if flags & re.VERBOSE:
            continue
        rewritten = superset(pattern, window)
        if rewritten is not None:
            out.append((index, rewritten.encode("utf-8"), _hs_flags(flags)))
    return out


def cache_dir() -> Path:
    """Where compiled databases are kept."""
    chosen = os.environ.get("RECALLTRACE_CACHE_DIR")
    if chosen:
        return Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "recalltrace"


class Gate:
    """A database of the rules' rewrites, built on a thread of its own (``ready`` until then
    False)."""

    def __init__(self, specs: Sequence[Spec]) -> None:
        self._specs = list(specs)
        self.database: Any = None
        self.included: frozenset[int] = frozenset()
        self._always: list[int] = []
        """The indices of the specs in the database (the others always run)."""
        self.done = threading.Event()
        self._local = threading.local()
        self._expressions = _expressions(self._specs)
        # The expressions as compiled, their flags and Hyperscan's version name the database.
        digest = hashlib.sha256(getattr(hyperscan, "__version__", "?").encode())
        for index, expression, flags in self._expressions:
            digest.update(f"\0{index}\0{flags}\0".encode() + expression)
        self.key = digest.hexdigest()[:40]

    @property
    def ready(self) -> bool:
        return self.database is not None

    def start(self) -> None:
        threading.Thread(target=self._build, name="recalltrace-scrub-gate", daemon=True).start()

    def _build(self) -> None:
        try:
            if not self._load():
                self._compile()
        except Exception:  # a gate that cannot be built leaves every rule to run
            logger.debug("scrubbing's compiled gate could not be built", exc_info=True)
        finally:
            self.done.set()

    def _path(self) -> Path:
        return cache_dir() / f"scrub-gate-{self.key}.hsdb"

    def _load(self) -> bool:
        try:
            data = self._path().read_bytes()
        except OSError:
            return False
        try:
            magic, header, payload = data.split(b"\n", 2)
            fields = json.loads(header)
            if magic + b"\n" != _FORMAT or hashlib.sha256(payload).hexdigest() != fields["sha256"]:
                raise ValueError("not a database of this version, or damaged")
            included = frozenset(int(index) for index in fields["included"])
            database = hyperscan.loadb(payload, hyperscan.HS_MODE_BLOCK)
        except Exception:
            logger.debug("scrubbing's compiled gate cache is unreadable", exc_info=True)
            return False
        self._set(database, included)
        counts["loaded"] += 1
        return True

    def _compile(self) -> None:
        expressions = []
        for index, expression, flags in self._expressions:
            alone = hyperscan.Database()
            try:
                alone.compile(expressions=[expression], ids=[index], elements=1, flags=[flags])
            except hyperscan.error:
                continue  # left out: its rule always runs
            expressions.append((index, expression, flags))
        database = hyperscan.Database()
        database.compile(
            expressions=[expression for _, expression, _ in expressions],
            ids=[index for index, _, _ in expressions],
            elements=len(expressions),
            flags=[flags for _, _, flags in expressions],
        )
        self._set(database, frozenset(index for index, _, _ in expressions))
        counts["compiled"] += 1
        self._store(hyperscan.dumpb(database))

    def _set(self, database: Any, included: frozenset[int]) -> None:
        self.included = included
        self._always = [index for index in range(len(self._specs)) if index not in included]
        self.database = database  # last: ``ready`` from here on

    def _store(self, payload: bytes) -> None:
        header = json.dumps(
            {"sha256": hashlib.sha256(payload).hexdigest(), "included": sorted(self.included)}
        ).encode()
        path = self._path()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".scrub-gate-")
            try:
                with os.fdopen(handle, "wb") as out:
                    out.write(_FORMAT + header + b"\n" + payload)
                os.replace(temporary, path)
            except BaseException:
                os.unlink(temporary)
                raise
        except OSError:
            logger.debug("scrubbing's compiled gate cache cannot be written", exc_info=True)

    def may_match(self, view: str) -> set[int]:
        """The indices of the specs whose rewrite matches somewhere in ``view`` (ASCII), and
        of those left out of the database."""
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = self._local.scratch = hyperscan.Scratch(self.database)
        found: set[int] = set()

        def matched(index: int, start: int, end: int, flags: int, context: Any) -> None:
            found.add(index)

        data = view.encode("ascii", "recalltrace-gate")
        self.database.scan(data, match_event_handler=matched, scratch=scratch)
        found.update(self._always)
        return found


_GATES: dict[str, Gate] = {}
_LOCK = threading.Lock()


def _gate(specs: Sequence[Spec]) -> Gate | None:
    """The gate of ``specs``, shared by every scrubber of this process with the same rules and
    started on first request; ``None`` without Hyperscan."""
    if not available():
        return None
    candidate = Gate(specs)
    with _LOCK:
        known = _GATES.get(candidate.key)
        if known is not None:
            return known
        _GATES[candidate.key] = candidate
    candidate.start()
    return candidate


class RuleGate:
    """The gate of one scrubber's rules: ``(name, compiled expression, group)`` tuples and a
    rule file set's rules (objects with a ``regex`` and ``leading``: whether each match starts
    at a keyword; those that do not are searched in windows, as are ``windowed``, named by
    their expression). The database is asked for on the first ``skipped``."""

    def __init__(self, rules: Iterable[Any], windowed: set[str], files: Any) -> None:
        self._rules: list[Any] = []
        self._specs: list[Spec] = []
        for rule in rules:
            regex = rule[1]
            self._rules.append(rule)
            self._specs.append((regex.pattern, regex.flags, regex.pattern in windowed))
        for rule in getattr(files, "rules", ()):
            self._rules.append(rule)
            self._specs.append((rule.regex.pattern, rule.regex.flags, not rule.leading))
        self._index = {id(rule): index for index, rule in enumerate(self._rules)}
        self._gate: Gate | bool | None = False  # False: not asked for yet; True: failed

    def keep(self, rules: list[Any], view: str) -> list[Any]:
        """``rules`` (in their order) without those whose rewrite matches nowhere in ``view``
        (all of them while the database is not ready, for text it does not read, and when
        fewer than ``FEWEST`` of them are in the database: then the scan costs more than the
        rules it may skip)."""
        index = self._index
        if len(view) < SHORTEST or sum(id(rule) in index for rule in rules) < FEWEST:
            return rules
        skipped = self.skipped(view)
        if skipped is None:
            return rules
        return [rule for rule in rules if id(rule) not in skipped]

    def skipped(self, view: str) -> frozenset[int] | None:
        """The ``id`` of each rule that matches nowhere in ``view``; ``None`` until the
        database is ready, and for text it does not read (then every rule runs)."""
        gate = self._gate
        if gate is False:
            gate = self._gate = _gate(self._specs)
        if len(view) < SHORTEST or gate is None or gate is True or not gate.ready:
            return None
        if not readable(view):
            return None
        try:
            may = gate.may_match(view)
        except Exception:  # a database this machine cannot run (one cached on another)
            logger.debug("scrubbing's compiled gate failed; not used", exc_info=True)
            self._gate = True
            return None
        return frozenset(id(rule) for index, rule in enumerate(self._rules) if index not in may)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the database to be built (or found unbuildable); whether it is ready.
        Starts building it when no ``skipped`` has."""
        if self._gate is False:
            self._gate = _gate(self._specs)
        if self._gate is None or self._gate is True or self._gate is False:
            return False
        self._gate.done.wait(timeout)
        return self._gate.ready
