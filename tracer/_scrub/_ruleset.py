"""Rule files in gitleaks' schema: each rule a regular expression with keywords, an optional
secret group, a minimum entropy and allowlists. The scrubber ships gitleaks' own default rules
(``rules/gitleaks.toml``, MIT, see ``rules/LICENSE-gitleaks``) and a few more of its own
(``rules/recalltrace.toml``); users may add files of their own.

The expressions are written for Go's RE2; the few constructs Python reads differently are
rewritten on load (a flag group in the middle of an expression, ``\\z``). A rule runs only in a
text holding a run of 12 or more token characters and one of the rule's keywords, and there
only at each keyword (or around it): the keyword prefilter (``_prefilter``) finds every rule's
keywords in one pass.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

Hits = dict[str, list[int]]

RULES_DIR = Path(__file__).with_name("rules")
BUILTIN_RULE_FILES = (RULES_DIR / "gitleaks.toml", RULES_DIR / "recalltrace.toml")

# A run of characters a key, a token or a URL is made of; a rule-file rule only runs near one.
RUN = re.compile(r"[A-Za-z0-9_\-+/=.~:%]{16,}")
_WORD = re.compile(r"[a-z0-9]+")
_FIRST_THREE = operator.itemgetter(slice(None, 3))
# Every byte but a lower-case letter or a digit becomes a space.
_WORD_BYTES = bytes(i if 48 <= i <= 57 or 97 <= i <= 122 else 32 for i in range(256))
# Every character but a lower-case letter or a digit becomes a space.
# Occurrences of one keyword looked at in one text, at most.
_MAX_OCCURRENCES = 64
# How far before a run a rule's keyword (``twilio_key = ...``) and its match may start.
_WINDOW_BEFORE = 64
# A leading "any name characters" part only widens a match leftwards; it is dropped (it makes
# the expression try up to fifty characters at every position).
_LEADING_NAME = re.compile(r"^(\(\?i\))?\[\\w\.-\]\{0,50\}\?")


@dataclass(slots=True)
class FileRule:
    """One rule of a rule file, compiled."""

    name: str
    regex: re.Pattern[str]
    keywords: tuple[str, ...]
    secret_group: int | None
    entropy: float
    allow: list[tuple[str, re.Pattern[str]]] = field(default_factory=list)
    stopwords: tuple[str, ...] = ()
    leading: bool = True
    """Whether every match starts at (or just before) one of the keywords."""

    def secret_span(self, match: re.Match[str]) -> tuple[int, int]:
        """The span of the secret in a match: the rule's secret group, else the first group
        that took part, else the whole match (gitleaks' reading)."""
        if self.secret_group is not None:
            return match.span(self.secret_group)
        for index in range(1, (self.regex.groups or 0) + 1):
            if match.start(index) >= 0:
                return match.span(index)
        return match.span(0)

    def allowed(self, secret: str, match: str, line: str, global_allow: RuleFileSet) -> bool:
        """Whether an allowlist, a stopword or too little entropy exempts ``secret``."""
        if self.entropy and shannon_entropy(secret) < self.entropy:
            return True
        lowered = secret.lower()
        for stopword in (*self.stopwords, *global_allow.stopwords):
            if stopword in lowered:
                return True
        for target, regex in (*self.allow, *global_allow.allow):
            text = match if target == "match" else line if target == "line" else secret
            if regex.search(text) is not None:
                return True
        return False


# gitleaks' expressions are written for source code, where a secret ends at a quote, a space,
# a semicolon or the end of a line. In prose and documents it also ends at a sentence's
# punctuation ("the key was X.") and may follow a slash (an id like "kb/X").
_CODE_END = "(?:[\\x60'\"\\s;]|\\\\[nr]|$)"
_TEXT_END = "(?:[\\x60'\"\\s;.,:!?)\\]}>]|\\\\[nr]|$)"
_CODE_START = "(?:^|[\\\\'\"\\x60\\s>=:(,)])"
_TEXT_START = "(?:^|[\\\\'\"\\x60\\s>=:(,)/])"


def _for_prose(pattern: str) -> str:
    return pattern.replace(_CODE_END, _TEXT_END).replace(_CODE_START, _TEXT_START)


def shannon_entropy(text: str) -> float:
    """Bits per character of ``text``'s own character distribution."""
    if not text:
        return 0.0
    counts: dict[str, int] = {}
    for char in text:
        counts[char] = counts.get(char, 0) + 1
    size = len(text)
    return -sum(n / size * math.log2(n / size) for n in counts.values())


def go_to_python(pattern: str) -> str:
    """Rewrite the RE2 constructs Python reads differently: ``\\z`` is ``\\Z``; a flag group
    ``(?i)`` after the start applies to the rest of its enclosing group."""
    pattern = pattern.replace(r"\z", r"\Z")
    out: list[str] = []
    closers: list[int] = []  # per open group: how many "(?i:" wrappers to close with it
    top = 0  # wrappers opened outside any group, closed at the end
    index = 0
    in_class = False
    while index < len(pattern):
        char = pattern[index]
        if char == "\\":
            out.append(pattern[index : index + 2])
            index += 2
            continue
        if in_class:
            in_class = char != "]"
            out.append(char)
        elif char == "[":
            in_class = True
            out.append(char)
            if pattern[index + 1 : index + 2] == "]":  # a class may open with "]"
                out.append("]")
                index += 1
        elif pattern.startswith("(?i)", index) and index > 0:
            out.append("(?i:")
            if closers:
                closers[-1] += 1
            else:
                top += 1
            index += 4
            continue
        elif char == "(":
            closers.append(0)
            out.append(char)
        elif char == ")":
            wrappers = closers.pop() if closers else 0
            out.append(")" * wrappers + ")")
        else:
            out.append(char)
        index += 1
    out.append(")" * top)
    return "".join(out)


class RuleFileSet:
    """The compiled rules of one or more rule files, with their keyword gate."""

    def __init__(self, paths: Sequence[Path | str]) -> None:
        self.rules: list[FileRule] = []
        self.allow: list[tuple[str, re.Pattern[str]]] = []
        self.stopwords: tuple[str, ...] = ()
        self.skipped: list[str] = []  # rules with no expression for text (path-only)
        by_keyword: dict[str, list[int]] = {}
        for path in paths:
            self._load(Path(path), by_keyword)
        # Keywords are looked up by their first word (a run of letters and digits): by its
        # first three characters, or the whole word when it is shorter and punctuation follows
        # it ("sk_live"); a text's words give both in one pass, and only the keywords filed
        # under those are searched for. The rest (no word first, or a short one that may stand
        # inside a word, like "ey" or "q~") are searched for in every text that passes the gate.
        self._by_start: dict[str, list[str]] = {}
        self._anywhere: list[str] = []
        for keyword in by_keyword:
            word = _WORD.match(keyword)
            if word is None or (
                len(word.group()) < 3
                and keyword[word.end() : word.end() + 1] not in ("_", "-", ".")
            ):
                self._anywhere.append(keyword)
            else:
                self._by_start.setdefault(word.group()[:3], []).append(keyword)
        self._by_keyword = by_keyword
        self._by_start_bytes = {key.encode(): value for key, value in self._by_start.items()}
        self._start_keys = frozenset(self._by_start_bytes)

    def _load(self, path: Path, by_keyword: dict[str, list[int]]) -> None:
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ValueError(f"scrubbing rule file {path} cannot be read: {exc}") from None
        if not isinstance(data.get("rules", []), list):
            raise ValueError(f"scrubbing rule file {path}: 'rules' must be a list of tables")
        glob = data.get("allowlist")
        if isinstance(glob, dict):
            self.allow.extend(_allowlist(glob, path, "global allowlist"))
            self.stopwords += tuple(str(word).lower() for word in glob.get("stopwords", ()))
        for entry in data.get("rules", []):
            name = str(entry.get("id", "")) if isinstance(entry, dict) else ""
            if not name:
                raise ValueError(f"scrubbing rule file {path}: a rule has no id")
            if "regex" not in entry:
                self.skipped.append(name)
                continue
            source = _for_prose(_LEADING_NAME.sub(lambda m: m.group(1) or "", str(entry["regex"])))
            try:
                regex = re.compile(go_to_python(source))
            except re.error as exc:
                raise ValueError(
                    f"scrubbing rule file {path}: rule {name}'s regex does not compile ({exc})"
                ) from None
            keywords = tuple(str(word).lower() for word in entry.get("keywords", ()))
            if not keywords:
                raise ValueError(
                    f"scrubbing rule file {path}: rule {name} has no keywords (each rule needs "
                    "at least one, the text it must hold to be searched)"
                )
            group = entry.get("secretGroup")
            rule = FileRule(
                name=name.replace("-", "_"),
                regex=regex,
                keywords=keywords,
                secret_group=int(group) if group else None,
                entropy=float(entry.get("entropy", 0.0)),
            )
            rule.leading = _starts_with_keyword(source, keywords)
            for allowlist in entry.get("allowlists", ()):
                if "paths" in allowlist:
                    continue  # about file paths: text has none
                rule.allow.extend(_allowlist(allowlist, path, name))
                rule.stopwords += tuple(str(w).lower() for w in allowlist.get("stopwords", ()))
            position = len(self.rules)
            self.rules.append(rule)
            for keyword in keywords:
                by_keyword.setdefault(keyword, []).append(position)

    def keywords(self) -> list[str]:
        return list(self._by_keyword)

    def select(
        self, lowered: str, words: Iterable[bytes] | None = None, hits: Hits | None = None
    ) -> list[FileRule]:
        """The rules one of whose keywords the lower-cased text ``lowered`` holds, in file
        order; ``words`` are its words (``words_of``) when known, ``hits`` where the keyword
        prefilter found each keyword (then only those are looked at)."""
        if hits is not None:
            found: set[int] = set()
            for keyword in hits.keys() & self._by_keyword.keys():
                found.update(self._by_keyword[keyword])
            return [self.rules[i] for i in sorted(found)]
        if words is None:
            words = lowered.encode("ascii", "ignore").translate(_WORD_BYTES).split()
        starts = set(map(_FIRST_THREE, words))
        positions: set[int] = set()
        by_keyword = self._by_keyword
        by_start = self._by_start_bytes
        for start in starts & self._start_keys:
            for keyword in by_start[start]:
                if keyword in lowered:
                    positions.update(by_keyword[keyword])
        for keyword in self._anywhere:
            if keyword in lowered:
                positions.update(by_keyword[keyword])
        return [self.rules[i] for i in sorted(positions)]

    def matches(
        self, rule: FileRule, text: str, lowered: str, hits: Hits | None = None
    ) -> Iterable[re.Match[str]]:
        """The rule's matches in ``text``, looked for where its keywords stand (as the keyword
        prefilter found them, ``hits``, when given): at each one (or one character before it,
        a quote or a bracket) when the expression starts with a keyword, else in the 256
        characters around it."""
        seen: set[int] = set()
        windows: list[tuple[int, int]] = []
        flags = _flags_needed(rule.regex)
        for keyword in rule.keywords:
            if hits is not None:
                positions: Iterable[int] = hits.get(keyword, ())[:_MAX_OCCURRENCES]
            else:
                positions = _occurrences(lowered, keyword)
            for position in positions:
                if flags and not _flag_within_reach(text, max(0, position - 1), flags):
                    continue
                if rule.leading:
                    for start in range(position, max(-1, position - 2), -1):
                        found = rule.regex.match(text, start)
                        if found is not None:
                            if found.start() not in seen:
                                seen.add(found.start())
                                yield found
                            break
                elif windows and windows[-1][1] >= position - 128 >= windows[-1][0]:
                    windows[-1] = (windows[-1][0], min(len(text), position + 128))
                else:
                    windows.append((max(0, position - 128), min(len(text), position + 128)))
            # Overlapping windows of one keyword are searched once, merged.
            for start, end in windows:
                for found in rule.regex.finditer(text, start, end):
                    if found.start() not in seen:
                        seen.add(found.start())
                        yield found
            windows.clear()


# Expressions that try up to five more lines after "curl" for a flag (gitleaks' curl rules):
# each try costs tens of microseconds, so the flag is looked for first. Every line-break
# character a match may cross (at most 11) lies within ``_LINES``' match.
_CURL_FLAGS = (
    (r"\bcurl\b(?:.*?|.*?(?:[\r\n]{1,2}.*?){1,5})[ \t\n\r](?:-H|--header)", ("-H", "--header")),
    (r"\bcurl\b(?:.*|.*(?:[\r\n]{1,2}.*){1,5})[ \t\n\r](?:-u|--user)", ("-u", "--user")),
)
_LINES = re.compile(r"(?:[^\r\n]*[\r\n]){0,11}[^\r\n]*")


def _flags_needed(regex: re.Pattern[str]) -> tuple[str, ...]:
    if regex.flags & (re.IGNORECASE | re.DOTALL):
        return ()
    for prefix, flags in _CURL_FLAGS:
        if regex.pattern.startswith(prefix):
            return flags
    return ()


def _flag_within_reach(text: str, position: int, flags: tuple[str, ...]) -> bool:
    end = _LINES.match(text, position).end()  # type: ignore[union-attr]
    return any(text.find(flag, position, end) >= 0 for flag in flags)


def _occurrences(lowered: str, keyword: str) -> Iterator[int]:
    position = lowered.find(keyword)
    for _ in range(_MAX_OCCURRENCES):
        if position < 0:
            return
        yield position
        position = lowered.find(keyword, position + 1)


_PREFIX_SYNTAX = re.compile(r"^(?:\(\?i\)|\\b|\(\?:|\(\?i:|\(\?-i:|\(|\^)+")


def _starts_with_keyword(source: str, keywords: Sequence[str]) -> bool:
    """Whether every match of an expression starts with one of ``keywords``: after flags,
    ``\\b`` and opening groups, it begins with a keyword, or with a group each of whose
    alternatives does."""
    rest = _PREFIX_SYNTAX.sub("", source)
    return all(_leads(alternative, keywords) for alternative in _top_alternatives(rest))


def _leads(alternative: str, keywords: Sequence[str]) -> bool:
    opener = _GROUP_OPEN.match(alternative)
    if opener is not None:
        inner = _top_alternatives(alternative[opener.end() :])
        return all(_leads(part, keywords) for part in inner)
    literal = _CASE_PAIR.sub(
        lambda m: m.group(1) if m.group(1).lower() == m.group(2).lower() else m.group(0),
        alternative,
    )
    literal = _ESCAPE.sub(r"\1", _LITERAL_PREFIX.match(literal).group()).lower()  # type: ignore[union-attr]
    if literal[-1:] in "?*" or literal.endswith("{0"):
        literal = literal[:-1]  # the character before an optional part may be absent
    return any(
        literal.startswith(keyword) or (len(literal) >= 3 and keyword.startswith(literal))
        for keyword in keywords
    )


# The literal start of an expression: up to its first group, class or alternation.
_LITERAL_PREFIX = re.compile(r"(?:\\.|[^\\()\[|.+*?{])*[?*]?")
_GROUP_OPEN = re.compile(r"\((?:\?[-i]*:)?")
_CASE_PAIR = re.compile(r"\[([A-Za-z])([A-Za-z])\]")


def _top_alternatives(rest: str) -> list[str]:
    """The alternatives of the group ``rest`` starts inside (``a|b)...``), up to its end."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    index = 0
    while index < len(rest):
        char = rest[index]
        if char == "\\":
            current.append(rest[index : index + 2])
            index += 2
            continue
        if char == "(":
            depth += 1
        elif char == ")":
            if depth == 0:
                break
            depth -= 1
        elif char == "|" and depth == 0:
            parts.append("".join(current))
            current = []
            index += 1
            continue
        current.append(char)
        index += 1
    parts.append("".join(current))
    return parts


_ESCAPE = re.compile(r"\\([^A-Za-z0-9])")


def words_of(lowered: str) -> set[bytes]:
    """The distinct runs of ASCII letters and digits of a lower-cased text (at C speed)."""
    return set(lowered.encode("ascii", "ignore").translate(_WORD_BYTES).split())


def windows_of(text: str) -> list[tuple[int, int]]:
    """The spans of ``text`` rule-file rules are searched in: each run of 16 token characters
    with the 64 characters before it and the character after it, overlapping ones merged."""
    spans: list[tuple[int, int]] = []
    for match in RUN.finditer(text):
        start = max(0, match.start() - _WINDOW_BEFORE)
        end = min(len(text), match.end() + 1)
        if spans and start <= spans[-1][1]:
            spans[-1] = (spans[-1][0], end)
        else:
            spans.append((start, end))
    return spans


def window_text(text: str) -> str:
    return "\n".join(text[start:end] for start, end in windows_of(text))


def _allowlist(
    entry: dict[str, Any], path: Path, owner: str
) -> Iterable[tuple[str, re.Pattern[str]]]:
    target = str(entry.get("regexTarget", "secret"))
    for source in entry.get("regexes", ()):
        try:
            yield target, re.compile(go_to_python(str(source)))
        except re.error as exc:
            raise ValueError(
                f"scrubbing rule file {path}: an allowlist regex of {owner} does not compile "
                f"({exc})"
            ) from None
