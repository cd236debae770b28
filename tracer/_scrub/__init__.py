"""Scrubbing of secrets and personal data from a trace record before it is stored.

Three kinds of rules. Value patterns found inside text: the scrubber's own generic detectors
(``_patterns``: assignments and "the password is ..." phrases in several languages, credentials
in URLs, also percent-encoded, and in command lines, private key blocks with or without their
END line, base64 text that decodes to a secret, e-mail addresses, and card, IBAN, social
security and phone numbers checked by their checksums) and the token formats of rule files in
gitleaks' schema (``_ruleset``: gitleaks' own rules, shipped as data, a few more of the
scrubber's, and the user's). Sensitive key names in metadata (the whole value under such a key
is redacted). And the user's own expressions. Text is folded to one form first (NFKC, every
script's digits made ASCII) and matches are mapped back to the original. A callback may keep
or replace each match. Every change is noted on the record, without the secret itself.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from recalltrace.tracer._config import ScrubbingOptions, ScrubMatch
from recalltrace.tracer._scrub import _generic as G
from recalltrace.tracer._scrub import _patterns as P
from recalltrace.tracer._scrub import _prefilter
from recalltrace.tracer._scrub import _values as N
from recalltrace.tracer._scrub._ruleset import BUILTIN_RULE_FILES, FileRule, RuleFileSet

if TYPE_CHECKING:
    from recalltrace.storage.records import TraceRecord

logger = logging.getLogger("recalltrace.tracer")

# What the text's shape must show before a kind's gates are searched: a run of 16 key
# characters; an assignment ("=" or ":") and three capitals in a row; an assignment (the
# authorization gate is then searched in the lower-cased text, case-insensitively).
_LONG_RUN, _CAPITALS_ASSIGNED, _ASSIGNED = "long run", "capitals and assignment", "assignment"
_GATED = (
    (
        P.GITLAB,
        (
            "glpat-",
            "gldt-",
            "glptt-",
            "glrt-",
            "gloas-",
            "glcbt-",
            "glft-",
            "glimt-",
            "glagent-",
            "glsoat-",
            "GR1348941",
        ),
        _LONG_RUN,
    ),
    (P.AZURE_KEY, ("AccountKey=",), _LONG_RUN),
    (P.AZURE_SAS, ("sig=",), _LONG_RUN),
    (P.AWS_SECRET, ("aws", "AWS", "Aws"), _LONG_RUN),
    (P.SERVICE_KEY, ("SK", "SG.", "npm_", "key-", "shp", "xapp-"), _LONG_RUN),
    (P.ENV_SECRET, ("TOKEN", "SECRET", "PASSW", "KEY", "CREDENTIAL", "AUTH"), _CAPITALS_ASSIGNED),
    (P.BASIC_AUTH, ("authorization",), _ASSIGNED),
)
# Patterns whose gate is "enough digits", checked with the card number's (always last).
_DIGIT_GATED = (P.IBAN, P.SSN, P.PHONE)
_VALUE_PATTERNS = (
    P.KEY_BLOCK,
    P.WEBHOOK,
    P.BEARER,
    P.JWT,
    P.VENDOR_KEY,
    P.SPLIT_KEY,
    *(rule for rule, _, _ in _GATED),
    P.KEY_ASSIGNMENT,
    P.PASSWORD,
    P.PASSWORD_PHRASE,
    P.CURL_USER,
    P.JSON_PAIR,
    P.URL_PASSWORD,
    P.URL_PASSWORD_ENCODED,
    P.EMAIL,
    P.ENCODED,
    P.CARD,
    *_DIGIT_GATED,
)
_PLAIN = frozenset({str, int, float, bool, type(None)})
_Rule: TypeAlias = tuple[str, re.Pattern[str], int]
_AnyRule: TypeAlias = _Rule | FileRule
_Rules = list[_AnyRule]
# A redaction found in a text: start, end (in the original text), kind, replacement.
_Span = tuple[int, int, str, str]
_DIGITS_TO_ZERO = bytes.maketrans(b"123456789", b"000000000")
# Shape tests on a text's bytes, each a translation and a search for a long needle (both run
# in C at about a byte a nanosecond): the gated kinds below all hold a run of at least 16
# characters that may appear in a key, a token or a URL path; the configuration-name kind
# needs three capitals in a row. Prose has neither, so its gates are not even searched.
_TOKEN_CHARS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/_-=.%~:")
_TOKEN_RUN = bytes(ord("t") if i in _TOKEN_CHARS else 32 for i in range(256))
_BASE64_CHARS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
_BASE64_RUN = bytes(ord("b") if i in _BASE64_CHARS else 32 for i in range(256))
_CAPITALS = bytes(ord("A") if 65 <= i <= 90 else 32 for i in range(256))
_RUN_16 = b"t" * 16
_RUN_12 = b"t" * 12  # rule-file tokens may be as short as this
_RUN_24 = b"b" * 24
# Needles of the prefilter that only the gates read.
_GATE_NEEDLES = ("aws",)


def _holds(text: str, gates: tuple[str, ...], scan: _prefilter.Scan | None) -> bool:
    """Whether ``text`` holds one of ``gates``, each looked for in it only when its lower-case
    form is among the prefilter's hits (when there is a ``scan`` of ``text``)."""
    if scan is None:
        return any(gate in text for gate in gates)
    hits = scan.hits
    return any(gate in text for gate in gates if gate.lower() in hits)


# What a "the password is ..." phrase or a password assignment holds, lower-cased: "pass"
# and "pwd" cover English, French, Norwegian and the German "Passwort"; the words of other
# scripts are looked for in text that is not ASCII.
_PHRASE_GATES_OTHER = tuple(word for word in P.PASSWORD_WORDS if not word.isascii())

# Key names whose values are always redacted (metadata of the record and of documents).
_SENSITIVE_KEY = (
    r"password|passwd|passphrase|pwd|secret|api[._ -]?key|apikey|(?<![a-z])token(?![a-z])"
    r"|access[._ -]?token|refresh[._ -]?token|auth(?:orization|entication|[._ -]?token)?(?![a-z])"
    r"|credential|private[._ -]?key|cookie|session[._ -]?id|(?<![a-z])session(?![a-z])"
    r"|csrf|xsrf|jwt|(?<![a-z])ssn(?![a-z])|social[._ -]?security|credit[._ -]?card"
    r"|card[._ -]?number|(?<![a-z])cvv(?![a-z])|(?<![a-z])iban(?![a-z])"
)

# Short document strings (ids, metadata keys and values) remembered as clean, at most.
_CLEAN_LIMIT = 8192
_CLEAN_CONTENT_CHARS = 8 * 1024 * 1024
"""Characters of retrieved documents' contents remembered as clean (found clean before: not
gated again); past it the memory is emptied and refilled."""
_CLEAN_CONTENT_LONGEST = 64 * 1024

# Metadata keys the tracer writes itself; their values are model names and token counts.
_OWN_METADATA_KEYS = frozenset({"llm"})


@functools.lru_cache(maxsize=8)
def rule_files(paths: tuple[str, ...]) -> RuleFileSet:
    """The compiled rules of ``paths`` (compiled once per process for each set of files)."""
    return RuleFileSet([Path(path) for path in paths])


class Scrubber:
    """Compiled scrubbing rules; safe to share between threads."""

    def __init__(self, options: ScrubbingOptions) -> None:
        self._replacement = options.replacement
        self._callback = options.callback
        self._defaults = options.default_patterns
        compiled = {
            id(rule): (rule[0], re.compile(rule[1], rule[3]), rule[2]) for rule in _VALUE_PATTERNS
        }

        def rule(pattern: tuple[str, str, int, int]) -> _Rule:
            return compiled[id(pattern)]

        self._key_block = rule(P.KEY_BLOCK)
        self._webhook = rule(P.WEBHOOK)
        self._bearer = rule(P.BEARER)
        self._jwt = rule(P.JWT)
        self._vendor = rule(P.VENDOR_KEY)
        self._split = rule(P.SPLIT_KEY)
        self._gated = tuple((rule(pattern), gates, shape) for pattern, gates, shape in _GATED)
        self._assignment = rule(P.KEY_ASSIGNMENT)
        self._password = rule(P.PASSWORD)
        self._phrase = rule(P.PASSWORD_PHRASE)
        self._curl = rule(P.CURL_USER)
        self._json_pair = rule(P.JSON_PAIR)
        self._url_password = rule(P.URL_PASSWORD)
        self._url_encoded = rule(P.URL_PASSWORD_ENCODED)
        self._email = rule(P.EMAIL)
        self._encoded = rule(P.ENCODED)
        self._card = rule(P.CARD)
        self._digit_gated = tuple(rule(pattern) for pattern in _DIGIT_GATED)
        self._number_rule_ids = frozenset(map(id, (self._card, *self._digit_gated)))
        paths = tuple(str(path) for path in options.rule_files)
        if options.default_patterns:
            paths = tuple(str(path) for path in BUILTIN_RULE_FILES) + paths
        self._files = rule_files(paths) if paths else None
        key_parts = [_SENSITIVE_KEY] if options.default_patterns else []
        custom: list[_Rule] = []
        for pattern in options.extra_patterns:
            custom.append(("custom", re.compile(pattern, re.IGNORECASE), 0))
            key_parts.append(pattern)
        self._custom = tuple(custom)
        self._key_pattern = (
            re.compile("|".join(f"(?:{part})" for part in key_parts), re.IGNORECASE)
            if key_parts
            else None
        )
        self._callback_failed = False
        self._key_decisions: dict[str, bool] = {}
        self._names: dict[tuple[str, str], tuple[str, tuple[str, ...]]] = {}
        self._labels: dict[str, str] = {}
        self._clean: set[str] = set()  # short document strings in which no rule found anything
        # Retrieved contents in which no rule found anything: the same documents come back
        # request after request. Kept as the strings themselves (an exact match, no hash
        # trusted), within a character budget.
        self._clean_contents: set[str] = set()
        self._clean_content_chars = 0
        anchored = {
            self._password[1]: P.ANCHORS["password"],
            self._assignment[1]: P.ANCHORS["api_key"],
            self._phrase[1]: P.ANCHORS["phrase"],
            self._email[1]: P.ANCHORS["email"],
            self._url_password[1]: P.ANCHORS["url_password"],
        }
        self._anchored: dict[re.Pattern[str], tuple[tuple[str, ...], int]] = anchored
        # The keyword prefilter (see ``_prefilter``): each rule runs only where it may match.
        self._triggers = {compiled[id(p)][1]: spec for p, spec in _prefilter.TRIGGERS}
        self._prefilter = None
        if _prefilter.available():
            words = [*_prefilter.needles(), *G.NEEDLES, *_GATE_NEEDLES]
            words.extend(self._files.keywords() if self._files else ())
            self._prefilter = _prefilter.Prefilter(words)

    def _scan(self, view: str) -> _prefilter.Scan | None:
        return None if self._prefilter is None else _prefilter.Scan(view, self._prefilter)

    # -- text -------------------------------------------------------------------------------

    def _decide(self, path: str, value: str, pattern: str) -> str:
        if self._callback is None:
            return self._replacement
        try:
            decided = self._callback(ScrubMatch(path=path, value=value, pattern=pattern))
            return self._replacement if decided is None else str(decided)
        except Exception:
            if not self._callback_failed:
                self._callback_failed = True
                logger.exception("scrubbing callback raised; redacting the match")
            return self._replacement

    def scrub_text(
        self, text: str, path: str, notes: list[str] | None, rules: _Rules | None = None
    ) -> str:
        """Return ``text`` with every match redacted (or replaced by the callback).

        ``rules`` restricts the built-in patterns to those whose gate passed on a text that
        contains this one (see :meth:`scrub_record`); ``None`` gates ``text`` itself."""
        view, offsets = (text, None) if text.isascii() else P.normalise(text)
        scan = self._scan(view)
        if rules is None:
            rules = self._default_rules_for(view, None, scan)
        elif rules:
            encoded = view.encode("utf-8", "ignore")
            if b"0000" not in encoded.translate(_DIGITS_TO_ZERO):
                # The group's text held a long number and this field holds none: the number
                # patterns are skipped for it.
                rules = [rule for rule in rules if id(rule) not in self._number_rule_ids]
            if _RUN_12 not in encoded.translate(_TOKEN_RUN):
                # Nor do rule-file rules run on a field without a run of token characters.
                rules = [rule for rule in rules if type(rule) is not FileRule]
        if self._custom:
            rules = [*rules, *self._custom]
        if not rules:
            return text
        spans = self._find(view, rules, path, text, offsets, False, False, None, scan)
        if not spans:
            return text
        pieces: list[str] = []
        last = 0
        for start, end, name, replacement in sorted(spans):
            pieces.append(text[last:start])
            pieces.append(replacement)
            last = end
            if notes is not None:
                _note(notes, f"scrubbed {name} in {path}")
        pieces.append(text[last:])
        return "".join(pieces)

    def spans(self, text: str) -> list[tuple[int, int]]:
        """Where the rules find something in ``text``, in its offsets, without the callback
        (the generic detectors search decoded and joined text with it)."""
        view, offsets = (text, None) if text.isascii() else P.normalise(text)
        scan = self._scan(view)
        rules = self._default_rules_for(view, None, scan)
        if self._custom:
            rules = [*rules, *self._custom]
        found = self._find(view, rules, "", text, offsets, True, False, None, scan)
        return sorted((start, end) for start, end, _, _ in found)

    def _find(
        self,
        view: str,
        rules: _Rules,
        path: str,
        text: str,
        offsets: list[int] | None,
        probe: bool,
        nested: bool = False,
        lowered: str | None = None,
        scan: _prefilter.Scan | None = None,
    ) -> list[_Span]:
        """The redactions of ``rules`` in ``view`` (``text`` folded, see ``normalise``), in
        ``text``'s offsets. A match that overlaps one an earlier rule took is dropped, unless
        it covers it whole (then it replaces it). ``probe`` only looks (no callback)."""
        spans: list[_Span] = []
        for rule in rules:
            if isinstance(rule, FileRule):
                if self._files is None:
                    continue
                if lowered is None:
                    lowered = P.lower(view) if scan is None else scan.lowered
                hits = None if scan is None else scan.hits
                for match in self._files.matches(rule, view, lowered, hits):
                    start, end = rule.secret_span(match)
                    if end <= start:
                        continue
                    line_start = view.rfind("\n", 0, start) + 1
                    line_end = view.find("\n", end)
                    line = view[line_start : line_end if line_end >= 0 else len(view)]
                    if rule.allowed(view[start:end], match.group(), line, self._files):
                        continue
                    end = P.continued(view, end)
                    self._claim(spans, start, end, rule.name, path, text, offsets, probe)
                continue
            name, regex, group = rule
            anchors = self._anchored.get(regex)
            spec = self._triggers.get(regex) if scan is not None else None
            if spec is not None and scan is not None:
                found: Iterable[re.Match[str]] = _prefilter.matches(regex, spec, scan)
            elif scan is not None and type(regex) is G.Finder:
                found = regex.finditer(view, scan.hits)
            elif anchors is not None:
                if lowered is None:
                    lowered = P.lower(view) if scan is None else scan.lowered
                found = P.anchored_matches(regex, view, lowered, anchors)
            else:
                found = regex.finditer(view)
            for match in found:
                start, end = match.span(group)
                if start < 0 or end <= start:
                    continue
                if regex is self._json_pair[1] and (
                    self._key_pattern is None or not self.is_sensitive_key(match.group(1))
                ):
                    continue
                secret = view[start:end]
                if name == "encoded_secret":
                    if nested or not self._hides_secret(secret):
                        continue
                elif name == "split_key":
                    if nested or not self._split_secret(secret):
                        continue
                    name = "api_key"
                elif not P.plausible(name, secret, view, match):
                    continue
                if name in P.TOKEN_KINDS:
                    end = P.continued(view, end)
                self._claim(spans, start, end, name, path, text, offsets, probe)
        return spans

    def _claim(
        self,
        spans: list[_Span],
        start: int,
        end: int,
        name: str,
        path: str,
        text: str,
        offsets: list[int] | None,
        probe: bool,
    ) -> None:
        if offsets is not None:
            start, end = offsets[start], offsets[end - 1] + 1
        covered = []
        for index, (taken_start, taken_end, _, _) in enumerate(spans):
            if taken_start < end and start < taken_end:
                if not (start <= taken_start and taken_end <= end) or (
                    start == taken_start and end == taken_end
                ):
                    return
                covered.append(index)
        value = text[start:end]
        replacement = self._replacement if probe else self._decide(path, value, name)
        if replacement == value:
            return
        for index in reversed(covered):
            del spans[index]
        spans.append((start, end, name, replacement))

    def _split_secret(self, pieces: str) -> bool:
        """Whether two pieces, joined, are a key whose match reaches past the break."""
        first, second = pieces.split(None, 1)
        if not (any(c.isdigit() for c in second) and any(c.isalpha() for c in second)):
            return False  # a word after a key, not the rest of it
        head = len(first)
        joined = first + second
        rules = [rule for rule in self._default_rules_for(joined) if rule is not self._split]
        return any(
            start < head < end
            for start, end, _, _ in self._find(joined, rules, "", joined, None, True, True)
        )

    def _hides_secret(self, encoded: str) -> bool:
        """Whether base64 text decodes to text that holds something the scrubber redacts."""
        decoded = P.decode_base64(encoded)
        if decoded is None or len(decoded) < 8:
            return False
        rules = self._default_rules_for(decoded)
        rules = [rule for rule in rules if rule is not self._encoded]
        return bool(rules) and bool(self._find(decoded, rules, "", decoded, None, True, True))

    def _default_rules_for(
        self,
        text: str,
        candidates: list[FileRule] | None = None,
        scan: _prefilter.Scan | None = None,
    ) -> _Rules:
        """The rules whose gates pass on ``text``; of the rule-file rules, those whose
        keywords it holds among ``candidates`` (all when ``None``)."""
        # Single-character tests (memchr) guard the multi-character ones, which cost more.
        rules: _Rules = []
        if not self._defaults:
            return self._file_rules(text.lower(), rules, candidates, scan)
        hyphen = "-" in text
        if hyphen and "-----" in text and "PRIVATE KEY" in text:
            rules.append(self._key_block)
        encoded = text.encode("utf-8", "ignore")
        runs = encoded.translate(_TOKEN_RUN)
        long_run = _RUN_16 in runs
        if long_run and ("hooks.slack.com" in text or "discord" in text):
            rules.append(self._webhook)
        if "earer" in text or ("E" in text and "EARER" in text):
            rules.append(self._bearer)
        if "J" in text and "eyJ" in text:
            rules.append(self._jwt)
        if (
            (hyphen and P.vendor_hyphen(text))
            or ("_" in text and P.vendor_underscore(text))
            or ("A" in text and ("AKIA" in text or "ASIA" in text or "AIza" in text))
        ):
            rules.append(self._vendor)
            rules.append(self._split)
        assigned = "=" in text or ":" in text
        capitals = assigned and b"AAA" in encoded.translate(_CAPITALS)
        lowered = text.lower() if scan is None else scan.lowered
        for rule, gates, shape in self._gated:
            if shape is _LONG_RUN and long_run and _holds(text, gates, scan):
                rules.append(rule)
        if assigned and ("key" in lowered or "secret" in lowered or "token" in lowered):
            rules.append(self._assignment)
        password_word = "pass" in lowered or "pwd" in lowered
        if assigned and password_word:
            rules.append(self._password)
        for rule, gates, shape in self._gated:
            if shape is _CAPITALS_ASSIGNED:
                if capitals and _holds(text, gates, scan):
                    rules.append(rule)
            elif shape is _ASSIGNED and assigned and "uthorization" in lowered:
                rules.append(rule)
        if password_word or (
            not lowered.isascii() and any(word in lowered for word in _PHRASE_GATES_OTHER)
        ):
            rules.append(self._phrase)
        if hyphen and ("--user" in text or ("-u" in text and "curl" in lowered)):
            rules.append(self._curl)
        if '":' in text or '" :' in text:
            rules.append(self._json_pair)
        if "@" in text and "://" in text:
            # Before the e-mail rule, which would take "password@host" for an address.
            rules.append(self._url_password)
        if "%" in text and "%3a%2f%2f" in lowered:
            rules.append(self._url_encoded)
        if long_run or _RUN_12 in runs:
            self._file_rules(lowered, rules, candidates, scan)
        if "@" in text:
            rules.append(self._email)
        if long_run and _RUN_24 in encoded.translate(_BASE64_RUN):
            rules.append(self._encoded)
        # Numbers last: a webhook URL or a key holding a long number is taken whole first.
        if b"0000" in encoded.translate(_DIGITS_TO_ZERO):
            rules.append(self._card)
            rules.extend(self._digit_gated)
        rules.extend(G.rules_for(text, Scrubber, scan))  # generic detectors (``_generic``)
        return rules

    def _file_rules(
        self,
        lowered: str,
        rules: _Rules,
        candidates: list[FileRule] | None,
        scan: _prefilter.Scan | None,
    ) -> _Rules:
        """Add the rule-file rules whose keywords ``lowered`` holds (of ``candidates``)."""
        if candidates is not None:
            rules.extend(rule for rule in candidates if any(k in lowered for k in rule.keywords))
        elif self._files is not None:
            rules.extend(self._files.select(lowered, None, None if scan is None else scan.hits))
        return rules

    # -- structures -------------------------------------------------------------------------

    def is_sensitive_key(self, key: str) -> bool:
        """Whether values under the key name ``key`` are redacted as a whole."""
        known = self._key_decisions.get(key)
        if known is not None:
            return known
        sensitive = self._key_pattern is not None and self._key_pattern.search(key) is not None
        if len(self._key_decisions) < 4096:
            self._key_decisions[key] = sensitive
        return sensitive

    def _flat_and_harmless(self, metadata: dict[str, Any], texts: list[Any]) -> bool:
        """Add the text of ``metadata`` to ``texts``; True when it is a flat dict of scalars
        under harmless key names."""
        decisions = self._key_decisions
        for key, item in metadata.items():
            if type(item) is str:
                texts.append(item)
            elif (digits := N.number_text(item)) is not None:
                texts.append(digits)
            elif type(item) not in _PLAIN:
                texts.append(repr(metadata))
                return False
            if decisions.get(key) is not False and (
                type(key) is not str or self.is_sensitive_key(key)
            ):
                texts.append(repr(metadata))
                return False
        return True

    def scrub_value(
        self,
        value: Any,
        path: str,
        notes: list[str] | None,
        depth: int = 0,
        rules: _Rules | None = None,
        hidden: list[str] | None = None,
    ) -> Any:
        """Scrub strings and numbers (see ``_values``) inside ``value`` (dicts, lists,
        tuples), returning a scrubbed copy; ``hidden`` gets the strings inside the values
        redacted whole under sensitive keys (so that no note quotes them)."""
        if isinstance(value, str):
            return self.scrub_text(value, path, notes, rules)
        if type(value) is int or type(value) is float:
            return N.scrub_number(self, value, path, notes, rules)
        if depth > 20:
            return value
        if isinstance(value, dict):
            result: dict[Any, Any] = {}
            for key, item in value.items():
                key_text = str(key)
                if rules is None or rules or self._custom:
                    # A key is scrubbed like a value, before it appears in a path or a note.
                    scrubbed_key = self.scrub_text(key_text, f"{path}.<key>", notes, rules)
                    if scrubbed_key != key_text:
                        key = key_text = scrubbed_key
                item_path = f"{path}.{key_text}" if path else key_text
                if (
                    item is not None
                    and not (depth == 0 and path == "metadata" and key_text in _OWN_METADATA_KEYS)
                    and self.is_sensitive_key(key_text)
                ):
                    shown = item if isinstance(item, str) else repr(item)
                    replacement = self._decide(item_path, shown, "sensitive_key")
                    if replacement != shown:
                        if notes is not None:
                            _note(notes, f"scrubbed sensitive_key in {item_path}")
                        if hidden is not None:
                            _strings_of(item, hidden, 0)
                        result[key] = replacement
                        continue
                result[key] = self.scrub_value(item, item_path, notes, depth + 1, rules, hidden)
            return result
        if isinstance(value, (list, tuple)):
            items = [
                self.scrub_value(item, f"{path}[{index}]", notes, depth + 1, rules, hidden)
                for index, item in enumerate(value)
            ]
            return items if isinstance(value, list) else tuple(items)
        return value

    def scrub_record(self, record: TraceRecord) -> None:
        """Scrub every text field of ``record`` in place and note what changed.

        The fields are taken in three groups, each joined into one text: the retrieved
        documents' contents (most of the text), the record's metadata, and everything else
        (question, answer, references, ids, names, document metadata). Each rule whose gate
        passes on a group's text is run once over it (``_group_rules``), and only the rules
        that found something there run on the group's fields, which for typical text is
        none."""
        notes = record.notes
        # The app and service names come from span names and resource attributes a collector
        # receives: text like any other, the same for most records (so scrubbed once each).
        if record.app_name:
            record.app_name = self._scrub_name(record.app_name, "app_name", notes)
        if record.service_name:
            record.service_name = self._scrub_name(record.service_name, "service_name", notes)
        texts = [record.user_input, record.response, record.reference]
        texts.extend(getattr(record, name) for name in _ATTRIBUTE_FIELDS)
        texts.extend(record.tags)
        texts.extend(record.reference_contexts or ())
        texts.extend(record.reference_context_ids or ())
        # Ids and metadata keys and values of documents are text too: a secret can hide in
        # them as in any value. The same documents come back request after request, so those
        # short strings found clean before are not searched again.
        clean = self._clean
        short: list[str] = []
        short.extend(context.id for context in record.retrieved_contexts if context.id)
        for context in record.retrieved_contexts:
            if context.metadata:
                short.extend(str(key) for key in context.metadata)
        # Flat metadata without sensitive keys (the common case) only needs its strings gated.
        plain_metadata = set()
        for index, context in enumerate(record.retrieved_contexts):
            if context.metadata and self._flat_and_harmless(context.metadata, short):
                plain_metadata.add(index)
        if clean:
            short = [text for text in short if text not in clean]
        texts.extend(short)
        rules: _Rules = []
        content_rules: _Rules = []
        metadata_rules: _Rules = []
        if self._defaults or self._files is not None:
            rules = self._group_rules("\n".join(filter(None, texts)))
            if not rules and not self._custom:
                if len(clean) + len(short) > _CLEAN_LIMIT:
                    clean.clear()
                clean.update(text for text in short if len(text) <= 256)
            content_rules = self._content_rules(record)
            if record.metadata:
                # Its strings (keys and values) joined, not its repr: the colons and quotes a
                # repr adds would pass the assignment gates for every key named like a token.
                strings: list[str] = []
                _strings_of(record.metadata, strings, 0)
                metadata_rules = self._group_rules("\n".join(strings))
        if rules or content_rules or self._custom:
            if record.user_input is not None:
                record.user_input = self.scrub_text(record.user_input, "user_input", notes, rules)
            if record.response is not None:
                record.response = self.scrub_text(record.response, "response", notes, rules)
            if record.reference is not None:
                record.reference = self.scrub_text(record.reference, "reference", notes, rules)
            for name in _ATTRIBUTE_FIELDS:
                value = getattr(record, name)
                if value is not None:
                    setattr(record, name, self.scrub_text(value, name, notes, rules))
            if record.tags:
                record.tags = [
                    self.scrub_text(tag, f"tags[{index}]", notes, rules)
                    for index, tag in enumerate(record.tags)
                ]
            if record.reference_contexts is not None:
                record.reference_contexts = [
                    self.scrub_text(text, f"reference_contexts[{index}]", notes, rules)
                    for index, text in enumerate(record.reference_contexts)
                ]
            if record.reference_context_ids is not None:
                record.reference_context_ids = [
                    self.scrub_text(text, f"reference_context_ids[{index}]", notes, rules)
                    for index, text in enumerate(record.reference_context_ids)
                ]
            for index, context in enumerate(record.retrieved_contexts):
                if content_rules or self._custom:
                    context.content = self.scrub_text(
                        context.content,
                        f"retrieved_contexts[{index}].content",
                        notes,
                        content_rules,
                    )
                if context.id and (rules or self._custom):
                    context.id = self.scrub_text(
                        context.id, f"retrieved_contexts[{index}].id", notes, rules
                    )
        # Other metadata is walked: sensitive key names redact whatever value they hold.
        hidden: list[str] = []
        for index, context in enumerate(record.retrieved_contexts):
            if context.metadata and (rules or self._custom or index not in plain_metadata):
                where = f"retrieved_contexts[{index}].metadata"
                context.metadata = self.scrub_value(
                    context.metadata, where, notes, 0, rules, hidden
                )
        if record.metadata:
            record.metadata = self.scrub_value(
                record.metadata, "metadata", notes, 0, metadata_rules, hidden
            )
        # Notes name fields and keys (a key path under a sensitive key quotes what it held),
        # and carry messages (a document that could not be read says why): whatever reached
        # them is scrubbed too, without notes of its own.
        if notes:
            record.notes = N.scrub_notes(self, notes, hidden, self._replacement)

    def _content_rules(self, record: TraceRecord) -> _Rules:
        """The rules that find something in the record's retrieved contents, gating only the
        contents not found clean before (all of them with custom patterns or a callback,
        whose decisions the gates do not cover); contents found clean are remembered."""
        contents = [context.content for context in record.retrieved_contexts]
        if self._custom:
            return self._group_rules("\n".join(contents))
        known = self._clean_contents
        unknown = [text for text in contents if text not in known]
        if not unknown:
            return []
        rules = self._group_rules("\n".join(unknown))
        if not rules:
            for text in unknown:
                if len(text) > _CLEAN_CONTENT_LONGEST:
                    continue
                if self._clean_content_chars + len(text) > _CLEAN_CONTENT_CHARS:
                    known.clear()
                    self._clean_content_chars = 0
                if text not in known:
                    known.add(text)
                    self._clean_content_chars += len(text)
        return rules

    def _scrub_name(self, name: str, path: str, notes: list[str]) -> str:
        """``scrub_text`` for a name that recurs from record to record, remembered (without a
        callback, whose decisions are its own)."""
        if self._callback is not None:
            return self.scrub_text(name, path, notes)
        known = self._names.get((name, path))
        if known is None:
            added: list[str] = []
            known = (self.scrub_text(name, path, added), tuple(added))
            if len(self._names) >= 1024:
                self._names.clear()
            self._names[(name, path)] = known
        for line in known[1]:
            _note(notes, line)
        return known[0]

    def scrub_label(self, name: str) -> str:
        """``name`` scrubbed for use as a metric label (remembered per distinct name)."""
        known = self._labels.get(name)
        if known is None:
            known = self.scrub_text(name, "label", None)
            if len(self._labels) >= 1024:
                self._labels.clear()
            self._labels[name] = known
        return known

    def _group_rules(self, text: str) -> _Rules:
        """The rules that find something in ``text``, a group's fields joined by line breaks
        (folded first, as each field will be): each rule whose gate passes is run once over
        the whole group, and only those that found something run on its fields."""
        view = text if text.isascii() else P.normalise(text)[0]
        scan = self._scan(view)
        rules = self._default_rules_for(view, None, scan)
        if not rules:
            return rules
        low = P.lower(view) if scan is None else scan.lowered
        find = self._find
        return [r for r in rules if find(view, [r], "", view, None, True, False, low, scan)]


# The record's request attributes, scrubbed like ids (a secret or an address may be one).
_ATTRIBUTE_FIELDS = ("release", "environment", "user_id", "session_id")


def _strings_of(value: Any, out: list[str], depth: int) -> None:
    """Every string :meth:`Scrubber.scrub_value` would scrub in ``value`` (keys as text)."""
    if isinstance(value, str):
        out.append(value)
    elif (digits := N.number_text(value)) is not None:
        out.append(digits)
    elif depth > 20:
        return
    elif isinstance(value, dict):
        for key, item in value.items():
            out.append(key if isinstance(key, str) else str(key))
            _strings_of(item, out, depth + 1)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _strings_of(item, out, depth + 1)


def _note(notes: list[str], line: str) -> None:
    if line not in notes:
        notes.append(line)


def build_scrubber(options: ScrubbingOptions | bool | None) -> Scrubber | None:
    """A scrubber for the options, or ``None`` when scrubbing is off."""
    if options is False:
        return None
    if options is None or options is True:
        options = ScrubbingOptions()
    return Scrubber(options)


def default_pattern_names() -> Sequence[str]:
    """Names of the built-in value patterns and of the built-in rule files' rules (for
    documentation and tests)."""
    files = rule_files(tuple(str(path) for path in BUILTIN_RULE_FILES))
    names = [name for name, _, _, _ in _VALUE_PATTERNS] + [rule.name for rule in files.rules]
    return tuple(dict.fromkeys(names))
