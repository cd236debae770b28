"""Scrubbing of secrets and personal data from a trace record before it is stored.

Two kinds of rules: value patterns found inside text (API keys and tokens of many vendors,
webhook URLs, bearer and basic credentials, passwords written as ``password=...`` or inside a
URL, e-mail addresses, card numbers, IBANs, social security and phone numbers) and sensitive key
names in metadata (the whole value under such a key is redacted). A callback may keep or replace
each match. Every change is noted on the record, without the secret itself.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from recalltrace.tracer._config import ScrubbingOptions, ScrubMatch

if TYPE_CHECKING:
    from recalltrace.storage.records import TraceRecord

logger = logging.getLogger("recalltrace.tracer")

# The built-in value patterns: (name, pattern, group to redact (0 = the whole match), flags).
# Each has a cheap gate in ``Scrubber._default_rules_for`` (substring tests run at C speed) so
# that the regular expressions only run on text that could match; most text skips them all.
_EMAIL = (
    "email",
    r"[A-Za-z0-9._%+\-]+@[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)*\.[A-Za-z]{2,}\b",
    0,
    0,
)
# Quotes around a key or a value may be escaped (JSON serialised inside a JSON string).
_QUOTE = r"(?:\\?[\"'])?"
# A value ends at white space, a quote (escaped or not), a comma or a semicolon.
_VALUE = r"((?:[^\s\"',;\\]|\\(?![\"']))+)"
_VALUE_6 = r"((?:[^\s\"',;\\]|\\(?![\"'])){6,})"
_PASSWORD = (
    "password",
    # A prefix joined by "_" or "-" is part of the name (DB_PASSWORD=, smtp-password:).
    r"(?<![A-Za-z0-9])(?:[A-Za-z0-9]+[_\-])*(?:password|passwd|passphrase|pwd)\b"
    + _QUOTE
    + r"\s*[:=]\s*"
    + _QUOTE
    + _VALUE,
    1,
    re.IGNORECASE,
)
_KEY_ASSIGNMENT = (
    "api_key",
    # A name may carry a prefix joined by "_" or "-" (aws_secret_access_key, x-api-key).
    r"(?<![A-Za-z0-9])(?:api[_\- ]?key|apikey|access[_\- ]?key|secret[_\- ]?key"
    r"|client[_\- ]?secret|access[_\- ]?token|auth[_\- ]?token|private[_\- ]?key)\b"
    + _QUOTE
    + r"\s*[:=]\s*"
    + _QUOTE
    + _VALUE_6,
    1,
    re.IGNORECASE,
)
_BEARER = ("bearer_token", r"\bbearer\s+([A-Za-z0-9\-._~+/]{8,}=*)", 1, re.IGNORECASE)
_JWT = ("bearer_token", r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}", 0, 0)
_VENDOR_KEY = (
    "api_key",
    r"[spr]k-(?:proj-|live-|test-|ant-(?:api\d+-)?)?[A-Za-z0-9_\-]{16,}"
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}"
    r"|gh[pousr]_[A-Za-z0-9]{30,}"
    r"|github_pat_[A-Za-z0-9_]{30,}"
    r"|xox[abposr]-[A-Za-z0-9-]{10,}"
    r"|AIza[0-9A-Za-z_\-]{35}"
    r"|hf_[A-Za-z0-9]{30,}"
    r"|[sr]k_(?:live|test)_[A-Za-z0-9]{16,}"
    r"|-----BEGIN[A-Z ]*PRIVATE KEY-----[\s\S]*?-----END[A-Z ]*PRIVATE KEY-----",
    0,
    0,
)
# "name": "value" inside text (JSON serialised into a string, possibly twice): the value under a
# sensitive key name is redacted as it would be under that key in metadata.
_JSON_PAIR = (
    "sensitive_key",
    r'\\?"([^"\\]{1,64})\\?"\s*:\s*\\?"((?:[^"\\]|\\(?!"))+)',
    2,
    0,
)
_CARD = ("card_number", r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d-])", 0, 0)

# More kinds, as maintained secret-detection rule sets know them (each with its own gate, a
# substring that must be present, in ``_GATED``).
_GITLAB = (
    "gitlab_token",
    r"\b(?:glpat|gldt|glptt|glrt|gloas|glcbt|glft|glimt|glagent|glsoat)-[A-Za-z0-9_\-]{20,}"
    r"|\bGR1348941[A-Za-z0-9_\-]{20,}",
    0,
    0,
)
_WEBHOOK = (
    "webhook_url",
    r"https://hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9+/_\-]{20,}"
    r"|https://(?:ptb\.|canary\.)?discord(?:app)?\.com/api/webhooks/\d+/[A-Za-z0-9_\-]{20,}",
    0,
    0,
)
_AZURE_KEY = (
    "azure_key",
    r"\bAccountKey=([A-Za-z0-9+/]{40,}={0,2})",
    1,
    0,
)
_AZURE_SAS = ("azure_sas", r"[?&]sig=([A-Za-z0-9%+/=]{16,})", 1, 0)
_AWS_SECRET = (
    "aws_secret_key",
    # Forty characters of base64 near the word AWS (checked in _apply: mixed case and a digit).
    r"(?<![A-Za-z0-9/+=])([A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])",
    1,
    0,
)
_URL_PASSWORD = (
    "url_password",
    # scheme://user:password@host: the password whole, whatever it holds but "@" and "/".
    r"\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^/\s:@]*:([^@\s/]+)@",
    1,
    0,
)
_BASIC_AUTH = (
    "authorization",
    r"\bauthorization\b"
    + _QUOTE
    + r"\s*[:=]\s*"
    + _QUOTE
    + r"(?:(?:basic|bearer|digest|token|apikey|negotiate)\s+)?([^\s\"',;]{6,})",
    1,
    re.IGNORECASE,
)
_ENV_SECRET = (
    "env_secret",
    # NAME_TOKEN=..., MY_SECRET: ... (upper-case configuration names, as in .env files)
    r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*_?(?:TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|PRIVATE_?KEY"
    r"|CREDENTIALS?|AUTH)(?:_[A-Z0-9]+)*\b" + _QUOTE + r"\s*[:=]\s*" + _QUOTE + _VALUE,
    1,
    0,
)
_SERVICE_KEY = (
    "api_key",
    r"\bSK[0-9a-fA-F]{32}\b"  # Twilio
    r"|\bSG\.[A-Za-z0-9_\-]{16,32}\.[A-Za-z0-9_\-]{16,64}"  # SendGrid
    r"|\bnpm_[A-Za-z0-9]{36}\b"  # npm
    r"|\bkey-[0-9a-zA-Z]{32}\b"  # Mailgun
    r"|\b[0-9a-f]{32}-[0-9a-f]{8}-[0-9a-f]{8}\b"  # Mailgun private keys
    r"|\bshp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}\b"  # Shopify
    r"|\bxapp-\d-[A-Z0-9]+-\d+-[a-z0-9]+",  # Slack app-level tokens
    0,
    0,
)
_IBAN = ("iban", r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,30}\b", 0, 0)
_SSN = ("ssn", r"(?<![\d-])(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}(?![\d-])", 0, 0)
_PHONE = (
    "phone_number",
    r"(?<![\w+])\+\d{1,3}[ .\-]?(?:\(\d{1,4}\)[ .\-]?)?\d{1,4}(?:[ .\-]?\d{2,4}){1,4}(?![\w])"
    r"|(?<![\w(])\(?\d{3}\)?[ .\-]\d{3}[ .\-]\d{4}(?![\w])",
    0,
    0,
)
# What the text's shape must show before a kind's gates are searched: a run of 16 key
# characters; an assignment ("=" or ":") and three capitals in a row; an assignment (the
# authorization gate is then searched in the lower-cased text, case-insensitively).
_LONG_RUN, _CAPITALS_ASSIGNED, _ASSIGNED = "long run", "capitals and assignment", "assignment"
_GATED = (
    (
        _GITLAB,
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
    (_WEBHOOK, ("hooks.slack.com", "discord"), _LONG_RUN),
    (_AZURE_KEY, ("AccountKey=",), _LONG_RUN),
    (_AZURE_SAS, ("sig=",), _LONG_RUN),
    (_AWS_SECRET, ("aws", "AWS", "Aws"), _LONG_RUN),
    (_BASIC_AUTH, ("authorization",), _ASSIGNED),
    (_ENV_SECRET, ("TOKEN", "SECRET", "PASSW", "KEY", "CREDENTIAL", "AUTH"), _CAPITALS_ASSIGNED),
    (_SERVICE_KEY, ("SK", "SG.", "npm_", "key-", "shp", "xapp-"), _LONG_RUN),
)
# Patterns whose gate is "enough digits", checked with the card number's.
_DIGIT_GATED = (_IBAN, _SSN, _PHONE)
_VALUE_PATTERNS = (
    _BEARER,
    _JWT,
    _VENDOR_KEY,
    _KEY_ASSIGNMENT,
    _PASSWORD,
    _EMAIL,
    _CARD,
    *(rule for rule, _, _ in _GATED),
    _URL_PASSWORD,
    *_DIGIT_GATED,
)
_PLAIN = frozenset({str, int, float, bool, type(None)})
_Rules = list[tuple[str, "re.Pattern[str]", int]]
_DIGITS_TO_ZERO = bytes.maketrans(b"123456789", b"000000000")
# Shape tests on a text's bytes, each a translation and a search for a long needle (both run
# in C at about a byte a nanosecond): the gated kinds below all hold a run of at least 16
# characters that may appear in a key, a token or a URL path; the configuration-name kind
# needs three capitals in a row. Prose has neither, so its gates are not even searched.
_TOKEN_CHARS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/_-=.%")
_TOKEN_RUN = bytes(ord("t") if i in _TOKEN_CHARS else 32 for i in range(256))
_CAPITALS = bytes(ord("A") if 65 <= i <= 90 else 32 for i in range(256))
_RUN_16 = b"t" * 16

# Key names whose values are always redacted (metadata of the record and of documents).
_SENSITIVE_KEY = (
    r"password|passwd|passphrase|pwd|secret|api[._ -]?key|apikey|(?<![a-z])token(?![a-z])"
    r"|access[._ -]?token|refresh[._ -]?token|auth(?:orization|entication|[._ -]?token)?(?![a-z])"
    r"|credential|private[._ -]?key|cookie|session[._ -]?id|(?<![a-z])session(?![a-z])"
    r"|csrf|xsrf|jwt|(?<![a-z])ssn(?![a-z])|social[._ -]?security|credit[._ -]?card"
    r"|card[._ -]?number|(?<![a-z])cvv(?![a-z])|(?<![a-z])iban(?![a-z])"
)

# Metadata keys the tracer writes itself; their values are model names and token counts.
_OWN_METADATA_KEYS = frozenset({"llm"})


def _iban_ok(text: str) -> bool:
    """ISO 13616's check: the country and check digits moved to the end, read as a number,
    leave 1 modulo 97."""
    compact = text.replace(" ", "")
    if not 15 <= len(compact) <= 34:
        return False
    moved = compact[4:] + compact[:4]
    number = "".join(str(int(c, 36)) for c in moved)
    return int(number) % 97 == 1


def _plausible(name: str, secret: str, text: str) -> bool:
    """Checks a pattern cannot express: a checksum, a character mix, a context word."""
    if name == "iban":
        return _iban_ok(secret)
    if name == "phone_number":
        return 8 <= sum(c.isdigit() for c in secret) <= 15
    if name == "aws_secret_key":
        return (
            any(c.isupper() for c in secret)
            and any(c.islower() for c in secret)
            and any(c.isdigit() for c in secret)
            and "aws" in text.lower()
        )
    return True


def _luhn_ok(digits: str) -> bool:
    total = 0
    for position, char in enumerate(reversed(digits)):
        value = ord(char) - 48
        if position % 2 == 1:
            value *= 2
            if value > 9:
                value -= 9
        total += value
    return total % 10 == 0


class Scrubber:
    """Compiled scrubbing rules; safe to share between threads."""

    def __init__(self, options: ScrubbingOptions) -> None:
        self._replacement = options.replacement
        self._callback = options.callback
        self._defaults = options.default_patterns
        compiled = {
            id(rule): (rule[0], re.compile(rule[1], rule[3]), rule[2]) for rule in _VALUE_PATTERNS
        }
        self._bearer = compiled[id(_BEARER)]
        self._jwt = compiled[id(_JWT)]
        self._vendor = compiled[id(_VENDOR_KEY)]
        self._assignment = compiled[id(_KEY_ASSIGNMENT)]
        self._password = compiled[id(_PASSWORD)]
        self._email = compiled[id(_EMAIL)]
        self._card = compiled[id(_CARD)]
        self._gated = tuple((compiled[id(rule)], gates, shape) for rule, gates, shape in _GATED)
        self._url_password = compiled[id(_URL_PASSWORD)]
        self._digit_gated = tuple(compiled[id(rule)] for rule in _DIGIT_GATED)
        self._last_number_rule = self._digit_gated[-1]
        self._number_rule_count = 1 + len(self._digit_gated)  # the card rule and these
        self._json_pair = (_JSON_PAIR[0], re.compile(_JSON_PAIR[1]), _JSON_PAIR[2])
        key_parts = [_SENSITIVE_KEY] if options.default_patterns else []
        custom: list[tuple[str, re.Pattern[str], int]] = []
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
        if self._defaults:
            if rules is None:
                rules = self._default_rules_for(text)
            elif (
                rules
                and rules[-1] is self._last_number_rule
                and b"0000" not in text.encode("utf-8", "ignore").translate(_DIGITS_TO_ZERO)
            ):
                # The group's text held a long number and this field holds none: the number
                # patterns (always last) are skipped for it.
                rules = rules[: -self._number_rule_count]
            for rule in rules:
                text = self._apply(text, rule[1], rule[2], rule[0], path, notes)
        for name, regex, group in self._custom:
            if regex.search(text) is not None:
                text = self._apply(text, regex, group, name, path, notes)
        return text

    def _default_rules_for(self, text: str) -> _Rules:
        # Single-character tests (memchr) guard the multi-character ones, which cost more.
        rules: _Rules = []
        if "earer" in text or ("E" in text and "EARER" in text):
            rules.append(self._bearer)
        if "J" in text and "eyJ" in text:
            rules.append(self._jwt)
        if (
            ("-" in text and _vendor_hyphen(text))
            or ("_" in text and _vendor_underscore(text))
            or ("A" in text and ("AKIA" in text or "ASIA" in text or "AIza" in text))
            or ("-----" in text and "PRIVATE KEY-----" in text)
        ):
            rules.append(self._vendor)
        encoded = text.encode("utf-8", "ignore")
        assigned = "=" in text or ":" in text
        if assigned:
            lowered = text.lower()
            if "key" in lowered or "secret" in lowered or "token" in lowered:
                rules.append(self._assignment)
            if "pass" in lowered or "pwd" in lowered:
                rules.append(self._password)
        if '":' in text or '" :' in text:
            rules.append(self._json_pair)
        if "@" in text:
            # Before the e-mail rule, which would take "password@host" for an address.
            if "://" in text:
                rules.append(self._url_password)
            rules.append(self._email)
        long_run = _RUN_16 in encoded.translate(_TOKEN_RUN)
        capitals = assigned and b"AAA" in encoded.translate(_CAPITALS)
        for rule, gates, shape in self._gated:
            if shape is _LONG_RUN:
                if long_run and any(gate in text for gate in gates):
                    rules.append(rule)
            elif shape is _CAPITALS_ASSIGNED:
                if capitals and any(gate in text for gate in gates):
                    rules.append(rule)
            elif assigned and "uthorization" in lowered:  # _ASSIGNED
                rules.append(rule)
        # Numbers last: a webhook URL or a key holding a long number is taken whole first.
        if b"0000" in encoded.translate(_DIGITS_TO_ZERO):
            rules.append(self._card)
            rules.extend(self._digit_gated)
        return rules

    def _apply(
        self,
        text: str,
        regex: re.Pattern[str],
        group: int,
        name: str,
        path: str,
        notes: list[str] | None,
    ) -> str:
        pieces: list[str] = []
        last = 0
        changed = False
        for match in regex.finditer(text):
            start, end = match.span(group)
            if start < 0:
                continue
            if regex is self._json_pair[1] and (
                self._key_pattern is None or not self.is_sensitive_key(match.group(1))
            ):
                continue
            secret = text[start:end]
            if name == "card_number" and not _luhn_ok(re.sub(r"[ -]", "", secret)):
                continue
            if not _plausible(name, secret, text):
                continue
            replacement = self._decide(path, secret, name)
            if replacement == secret:
                continue
            pieces.append(text[last:start])
            pieces.append(replacement)
            last = end
            changed = True
        if not changed:
            return text
        pieces.append(text[last:])
        if notes is not None:
            _note(notes, f"scrubbed {name} in {path}")
        return "".join(pieces)

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
    ) -> Any:
        """Scrub strings inside ``value`` (dicts, lists, tuples), returning a scrubbed copy."""
        if isinstance(value, str):
            return self.scrub_text(value, path, notes, rules)
        if depth > 20:
            return value
        if isinstance(value, dict):
            result: dict[Any, Any] = {}
            for key, item in value.items():
                key_text = str(key)
                if rules or self._custom:
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
                        result[key] = replacement
                        continue
                result[key] = self.scrub_value(item, item_path, notes, depth + 1, rules)
            return result
        if isinstance(value, (list, tuple)):
            items = [
                self.scrub_value(item, f"{path}[{index}]", notes, depth + 1, rules)
                for index, item in enumerate(value)
            ]
            return items if isinstance(value, list) else tuple(items)
        return value

    def scrub_record(self, record: TraceRecord) -> None:
        """Scrub every text field of ``record`` in place and note what changed.

        The gates of the built-in patterns run once per group of fields, over the group's text
        joined together: the retrieved documents' contents (most of the text), the record's
        metadata, and everything else (question, answer, references, ids, document metadata).
        Each field is then searched only with the patterns its group passed, which for typical
        text is none; a number in the question does not send every document through the
        number patterns, nor a ``prompt_tokens`` key in the metadata every document through
        the assignment pattern."""
        notes = record.notes
        texts = [record.user_input, record.response, record.reference]
        texts.extend(getattr(record, name) for name in _ATTRIBUTE_FIELDS)
        texts.extend(record.tags)
        texts.extend(record.reference_contexts or ())
        texts.extend(record.reference_context_ids or ())
        # Ids and metadata keys are text too: a secret can hide in them as in any value.
        texts.extend(context.id for context in record.retrieved_contexts if context.id)
        for context in record.retrieved_contexts:
            if context.metadata:
                texts.extend(str(key) for key in context.metadata)
        # Flat metadata without sensitive keys (the common case) only needs its strings gated.
        plain_metadata = set()
        for index, context in enumerate(record.retrieved_contexts):
            if context.metadata and self._flat_and_harmless(context.metadata, texts):
                plain_metadata.add(index)
        rules: _Rules = []
        content_rules: _Rules = []
        metadata_rules: _Rules = []
        if self._defaults:
            rules = self._default_rules_for("\x00".join(filter(None, texts)))
            content_rules = self._default_rules_for(
                "\x00".join(context.content for context in record.retrieved_contexts)
            )
            if record.metadata:
                # Its strings (keys and values) joined, not its repr: the colons and quotes a
                # repr adds would pass the assignment gates for every key named like a token.
                strings: list[str] = []
                _strings_of(record.metadata, strings, 0)
                metadata_rules = self._default_rules_for("\x00".join(strings))
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
        for index, context in enumerate(record.retrieved_contexts):
            if context.metadata and (rules or self._custom or index not in plain_metadata):
                context.metadata = self.scrub_value(
                    context.metadata, f"retrieved_contexts[{index}].metadata", notes, 0, rules
                )
        if record.metadata:
            record.metadata = self.scrub_value(
                record.metadata, "metadata", notes, 0, metadata_rules
            )


# The record's request attributes, scrubbed like ids (a secret or an address may be one).
_ATTRIBUTE_FIELDS = ("release", "environment", "user_id", "session_id")

_UNDERSCORE_PREFIXES = ("ghp", "gho", "ghu", "ghs", "ghr", "_pat", "hf", "sk", "rk")


# Finding a rare character is a memchr; a two-character substring search is far slower. So the
# vendor prefixes are looked for around each '-' or '_', up to a number of them.
_MAX_SEPARATORS = 64


def _vendor_underscore(text: str) -> bool:
    """Whether an underscore in ``text`` may follow a vendor key prefix (``ghp_``, ``hf_``,
    ``github_pat_``)."""
    index = text.find("_")
    for _ in range(_MAX_SEPARATORS):
        if index < 0:
            return False
        if text[max(0, index - 4) : index].endswith(_UNDERSCORE_PREFIXES):
            return True
        index = text.find("_", index + 1)
    return True


def _vendor_hyphen(text: str) -> bool:
    """Whether a hyphen in ``text`` may follow a vendor key prefix (``sk-``, ``pk-``, ``rk-``,
    ``xoxb-``...)."""
    index = text.find("-")
    for _ in range(_MAX_SEPARATORS):
        if index < 0:
            return False
        if index >= 2 and text[index - 1] == "k" and text[index - 2] in "spr":
            return True
        if index >= 4 and text[index - 4 : index - 1] == "xox":
            return True
        index = text.find("-", index + 1)
    return True


def _strings_of(value: Any, out: list[str], depth: int) -> None:
    """Every string :meth:`Scrubber.scrub_value` would scrub in ``value`` (keys as text)."""
    if isinstance(value, str):
        out.append(value)
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


TextScrub = Callable[[str], str]


def span_text_scrubber(scrubber: Scrubber | None, options: Any) -> TextScrub | None:
    """The function applied to span attribute text, when span scrubbing is on."""
    if scrubber is None or not isinstance(options, ScrubbingOptions):
        return None
    if not options.scrub_span_attributes:
        return None

    def scrub(text: str) -> str:
        return scrubber.scrub_text(text, "span", None)

    return scrub


def default_pattern_names() -> Sequence[str]:
    """Names of the built-in value patterns (for documentation and tests)."""
    return tuple(dict.fromkeys(name for name, _, _, _ in _VALUE_PATTERNS))
