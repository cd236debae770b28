"""The scrubber's own value patterns and the checks a pattern cannot express.

Each pattern is ``(name, expression, group to redact (0 = the whole match), flags)``. Vendor
token formats come mostly from the rule files (see ``_ruleset``); the patterns here are the
generic detectors (assignments, phrases in several languages, credentials in URLs and command
lines, key blocks) and personal data (e-mail addresses, card, social security, IBAN and phone
numbers), with the few vendor formats the scrubber has always known.
"""

from __future__ import annotations

import base64
import binascii
import re
import unicodedata
from collections.abc import Iterator

# -- e-mail addresses ----------------------------------------------------------------------------
# A local part of word characters (any script) and ". % + -", or a quoted one; a domain of labels
# in any script, or punycode. An address followed by ":" and a path is an SSH remote
# (git@github.com:acme/repo.git), not an address.
EMAIL = (
    "email",
    r"(?<![\w.%+\-])(?:\"[^\"\r\n@]{1,64}\"|[\w.%+\-]{1,64})@"
    r"(?:[\w\-]{1,63}\.)+(?:[^\W\d_]{2,24}|xn--[a-z0-9\-]{2,59})\b(?![:/]\w|@)",
    0,
    0,
)
# File extensions that look like top-level domains after "@" (logo@2x.png).
FILE_SUFFIXES = frozenset(
    [
        "png",
        "jpg",
        "jpeg",
        "gif",
        "svg",
        "webp",
        "bmp",
        "ico",
        "tif",
        "tiff",
        "pdf",
        "txt",
        "md",
        "rst",
        "csv",
        "tsv",
        "json",
        "yaml",
        "yml",
        "toml",
        "xml",
        "html",
        "htm",
        "css",
        "js",
        "mjs",
        "ts",
        "tsx",
        "jsx",
        "py",
        "pyc",
        "rb",
        "go",
        "rs",
        "java",
        "kt",
        "c",
        "h",
        "cc",
        "cpp",
        "hpp",
        "sh",
        "bash",
        "zsh",
        "ps1",
        "bat",
        "exe",
        "dll",
        "so",
        "dylib",
        "zip",
        "gz",
        "tgz",
        "bz2",
        "xz",
        "tar",
        "whl",
        "egg",
        "jar",
        "war",
        "lock",
        "log",
        "ini",
        "cfg",
        "conf",
        "env",
        "sql",
        "db",
        "sqlite",
        "parquet",
        "avro",
        "pb",
        "onnx",
        "pt",
        "bin",
        "dat",
        "bak",
        "tmp",
        "swp",
        "mp3",
        "mp4",
        "wav",
        "mov",
        "avi",
        "mkv",
        "woff",
        "woff2",
        "ttf",
        "otf",
        "eot",
        "map",
        "git",
    ]
)

# -- assignments and phrases ---------------------------------------------------------------------
# Quotes around a key or a value may be escaped (JSON serialised inside a JSON string).
_QUOTE = r"(?:\\?[\"'])?"
# A value ends at white space, a quote (escaped or not), a comma or a semicolon.
_VALUE = r"((?:[^\s\"',;\\]|\\(?![\"'])){1,256})"
_VALUE_6 = r"((?:[^\s\"',;\\]|\\(?![\"'])){6,256})"
PASSWORD = (
    "password",
    # A prefix joined by "_" or "-" may come before (DB_PASSWORD=, smtp-password:).
    r"(?<![A-Za-z0-9])(?:password|passwd|passphrase|pwd)\b"
    + _QUOTE
    + r"\s*[:=]\s*"
    + _QUOTE
    + _VALUE,
    1,
    re.IGNORECASE,
)
KEY_ASSIGNMENT = (
    "api_key",
    # A name may carry a prefix joined by "_" or "-" (aws_secret_access_key, x-api-key).
    r"(?<![A-Za-z0-9])(?:api[_\- ]?key|apikey|access[_\- ]?key|secret[_\- ]?key"
    r"|client[_\- ]?secret|access[_\- ]?token|auth[_\- ]?token|private[_\- ]?key"
    r"|session[_\- ]?token|refresh[_\- ]?token|secret)\b"
    + _QUOTE
    + r"\s*[:=]\s*"
    + _QUOTE
    + _VALUE_6,
    1,
    re.IGNORECASE,
)
# "The password is X" and its kin in several languages: a word for password, up to four more
# words ("for the staging database"), a verb or a colon, then the value (checked in
# ``plausible``: a plain word after "is" is prose, not a password).
PASSWORD_WORDS = (
    "password",
    "passwort",
    "mot de passe",
    "contraseña",
    "contrasena",
    "hasło",
    "lösenord",
    "passord",
    "пароль",
    "パスワード",
    "暗証番号",
    "密码",
    "密碼",
    "口令",
    "비밀번호",
    "passphrase",
    "passcode",
)
PASSWORD_PHRASE = (
    "password",
    r"(?:" + "|".join(re.escape(word) for word in PASSWORD_WORDS) + r")"
    r"(?:[ \t]+[^\s:=：]{0,23}[^\s:=：.!?。]){0,4}?[^\S\n]*"
    r"(?:\bis\b|\bwas\b|\bist\b|\blautet\b|\best\b|\bes\b|\bé\b|\bera\b|\bis now\b"
    r"|[:=：＝]|は|が|是|为|為|은|는|—|–)"
    r"[^\S\n]*[\"'«“„「『]?([^\s\"'»”“」』;,]{3,127}[^\s\"'»”“」』;,.!?:)。、])",
    1,
    re.IGNORECASE,
)
BEARER = ("bearer_token", r"\bbearer\s+([A-Za-z0-9\-._~+/]{8,}=*)", 1, re.IGNORECASE)
JWT = (
    "bearer_token",
    r"(?<![\w-])eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}(?:\.[A-Za-z0-9_-]*){1,3}",
    0,
    0,
)
VENDOR_KEY = (
    "api_key",
    r"(?<![A-Za-z0-9_\-])[spr]k-(?:proj-|live-|test-|svcacct-|admin-|ant-(?:api\d+-)?)?"
    r"[A-Za-z0-9_\-]{16,}"
    r"|(?<![A-Z0-9])(?:AKIA|ASIA)[0-9A-Z]{16}"
    r"|\bgh[pousr]_[A-Za-z0-9]{30,}"
    r"|\bgithub_pat_[A-Za-z0-9_]{30,}"
    r"|\bxox[abposr]-[A-Za-z0-9-]{10,}"
    r"|\bAIza[0-9A-Za-z_\-]{35}"
    r"|\bhf_[A-Za-z0-9]{30,}"
    r"|\b[sr]k_(?:live|test)_[A-Za-z0-9]{16,}",
    0,
    0,
)
# A private key block (PEM, OpenSSH, PGP), with its END line or, cut before it, to the end of
# its body.
KEY_BLOCK = (
    "private_key",
    r"-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----"
    r"(?:[\s\S]{0,20000}?-----END[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----"
    r"|(?:[A-Za-z0-9+/=:,.\- \t]*\r?\n?){0,400})",
    0,
    0,
)
# "name": "value" inside text (JSON serialised into a string, possibly twice): the value under a
# sensitive key name is redacted as it would be under that key in metadata.
JSON_PAIR = (
    "sensitive_key",
    r'\\?"([^"\\]{1,64})\\?"\s*:\s*\\?"((?:[^"\\]|\\(?!")){1,4096})',
    2,
    0,
)
# Digits with single spaces or hyphens between them, not inside a word or a hex string.
CARD = ("card_number", r"(?<![\w-])\d(?:[ -]?\d){12,18}(?![\w-])", 0, 0)

GITLAB = (
    "gitlab_token",
    r"\b(?:glpat|gldt|glptt|glrt|gloas|glcbt|glft|glimt|glagent|glsoat)-[A-Za-z0-9_\-]{20,}"
    r"|\bGR1348941[A-Za-z0-9_\-]{20,}",
    0,
    0,
)
WEBHOOK = (
    "webhook_url",
    r"https://hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9+/_\-]{20,}"
    r"|https://(?:ptb\.|canary\.)?discord(?:app)?\.com/api/webhooks/\d+/[A-Za-z0-9_\-]{20,}",
    0,
    0,
)
AZURE_KEY = ("azure_key", r"\bAccountKey=([A-Za-z0-9+/]{40,}={0,2})", 1, 0)
AZURE_SAS = ("azure_sas", r"[?&]sig=([A-Za-z0-9%+/=]{16,})", 1, 0)
AWS_SECRET = (
    "aws_secret_key",
    # Forty characters of base64 near the word AWS (checked in plausible: mixed case, a digit).
    r"(?<![A-Za-z0-9/+=])([A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])",
    1,
    0,
)
URL_PASSWORD = (
    "url_password",
    # scheme://user:password@host: the password whole, whatever it holds but "@" and "/".
    r"\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^/\s:@]*:([^@\s/]+)@",
    1,
    0,
)
# The same URL percent-encoded inside another (a redirect or a query parameter).
URL_PASSWORD_ENCODED = (
    "url_password",
    r"%3A%2F%2F(?:[A-Za-z0-9._~!$*+\-]|%(?!3A|40|2F)[0-9A-F]{2}){0,128}%3A"
    r"((?:[A-Za-z0-9._~!$*+\-]|%(?!2F)[0-9A-F]{2}){1,256})%40",
    1,
    re.IGNORECASE,
)
CURL_USER = (
    "cli_password",
    r"(?:^|\s)(?:-u|--user)(?:\s+|=)[\"']?[^\s:\"']{1,128}[\"']?:[\"']?([^\s\"']{1,256})",
    1,
    0,
)
BASIC_AUTH = (
    "authorization",
    r"\bauthorization\b"
    + _QUOTE
    + r"\s*[:=]\s*"
    + _QUOTE
    + r"(?:(?:basic|bearer|digest|token|apikey|negotiate)\s+)?([^\s\"',;]{6,})",
    1,
    re.IGNORECASE,
)
ENV_SECRET = (
    "env_secret",
    # NAME_TOKEN=..., MY_SECRET: ... (upper-case configuration names, as in .env files)
    r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*_?(?:TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|PRIVATE_?KEY"
    r"|CREDENTIALS?|AUTH)(?:_[A-Z0-9]+)*\b" + _QUOTE + r"\s*[:=]\s*" + _QUOTE + _VALUE,
    1,
    0,
)
SERVICE_KEY = (
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
# A base64 text long enough to hold a credential; decoded and searched (see Scrubber).
ENCODED = (
    "encoded_secret",
    r"(?<![A-Za-z0-9+/=_\-])(?:[A-Za-z0-9+/]{4}){6,}(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?"
    r"(?![A-Za-z0-9+/=_\-])",
    0,
    0,
)
IBAN = (
    "iban",
    r"(?<![\w-])(?:[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,30}|[a-z]{2}\d{2}[a-z0-9]{11,30})(?![\w-])",
    0,
    0,
)
SSN = ("ssn", r"(?<![\w-])(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}(?![\w-])", 0, 0)
PHONE = (
    "phone_number",
    r"(?<![\w+])\+\d{1,3}[ .\-]?(?:\(\d{1,4}\)[ .\-]?)?\d{1,4}(?:[ .\-]?\d{2,4}){1,4}(?![\w])"
    r"|(?<![\w(])\(?\d{3}\)?[ .\-]\d{3}[ .\-]\d{4}(?![\w])",
    0,
    0,
)
# Patterns searched only where one of their anchors (lower case) stands: (anchors, how many
# characters before an anchor a match may start). The others run over the whole text.
ANCHORS = {
    "password": (("password", "passwd", "passphrase", "pwd"), 0),
    "api_key": (("api", "access", "secret", "client", "auth", "private", "session", "refresh"), 0),
    "phrase": (PASSWORD_WORDS, 0),
    "email": (("@",), 66),
    "url_password": (("://",), 40),
}

# A key with a known prefix broken by a line break or a space before its rule could match it:
# the two pieces are joined and the joined text searched (see Scrubber).
# Known key prefixes, where a key broken into pieces is looked for.
SPLIT_PREFIXES = (
    r"(?<![\w\-])(?:[spr]k-|gh[pousr]_|github_pat_|xox[abposr]-|glpat-|hf_|AKIA|ASIA|AIza|npm_"
    r"|[sr]k_(?:live|test)_|dapi|do[opr]_v1_|pypi-|GOCSPX-|ya29\.|whsec_|gl(?:c|sa)_|SG\."
    r"|AGE-SECRET-KEY-1|eyJ)"
)
SPLIT_KEY = (
    "split_key",
    SPLIT_PREFIXES + r"[A-Za-z0-9_\-.]{2,}(?:[ \t]|\r?\n[ \t]*)[A-Za-z0-9_\-+/=.]{4,}",
    0,
    0,
)

# A piece of a key after a line break or a space: joined to the key found before it.
CONTINUATION = re.compile(r"(?:[ \t]|\r?\n[ \t]*)([A-Za-z0-9_\-+/]{8,128}={0,2})(?![^\s.,;:)\]}])")

# The kinds whose matches are tokens: a continuation after a line break or a space is theirs.
TOKEN_KINDS = frozenset(
    {"api_key", "bearer_token", "gitlab_token", "azure_key", "aws_secret_key", "private_key"}
)

# Lengths of the IBANs of the countries that issue them (ISO 13616 registry).
IBAN_LENGTHS = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22,
    "BR": 29, "BY": 28, "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DK": 18, "DO": 28,
    "EE": 20, "EG": 29, "ES": 24, "FI": 18, "FO": 18, "FR": 27, "GB": 22, "GE": 22, "GI": 23,
    "GL": 18, "GR": 27, "GT": 28, "HR": 21, "HU": 28, "IE": 22, "IL": 23, "IQ": 23, "IS": 26,
    "IT": 27, "JO": 30, "KW": 30, "KZ": 20, "LB": 28, "LC": 32, "LI": 21, "LT": 20, "LU": 20,
    "LV": 21, "MC": 27, "MD": 24, "ME": 22, "MK": 19, "MR": 27, "MT": 31, "MU": 30, "NL": 18,
    "NO": 15, "PK": 24, "PL": 28, "PS": 29, "PT": 25, "QA": 29, "RO": 24, "RS": 22, "SA": 24,
    "SC": 31, "SE": 24, "SI": 19, "SK": 24, "SM": 27, "ST": 25, "SV": 28, "TL": 23, "TN": 24,
    "TR": 26, "UA": 29, "VA": 22, "VG": 24, "XK": 20,
}  # fmt: skip

# Values that name where a secret comes from rather than hold one: code (os.environ[...],
# settings.KEY, ${VAR}, {{ secrets.X }}, <your-key>), and words used as placeholders.
_REFERENCE = re.compile(
    r"^(?:[A-Za-z_][\w.]*[\[(]|\$\{?[A-Za-z_]|\{\{|<[^>]*>?$|%\(?[A-Za-z_]|process\.env\b"
    r"|(?:os|env|settings|config|cfg|conf|self|this|secrets|vars|params)\.[A-Za-z_])"
)
_CODE_NAME = re.compile(r"[a-z]+(?:_[a-z]+)+|[a-z_]+(?:\.[a-z_]+)+")
_PLACEHOLDERS = frozenset(
    [
        "none",
        "null",
        "nil",
        "true",
        "false",
        "undefined",
        "empty",
        "redacted",
        "changeme",
        "xxx",
        "xxxx",
        "xxxxx",
        "xxxxxx",
        "********",
        "***",
        "****",
    ]
)
_REMOTE_LOGIN = re.compile(r"\b(?:ssh|scp|sftp|rsync|mosh)(?:\s+-\S+(?:\s+\d+)?)*\s+$")
# A parameter's name in an Authorization header with parameters (``Digest username="ops",
# ...``): a word in lower case (a first capital allowed), then "=" and an opening quote.
PARAMETER_NAME = re.compile(r"[A-Za-z][a-z]+(?:[_\-][a-z]+)*=(?=[\"'])")
_ASSIGNMENT_KINDS = frozenset({"password", "api_key", "env_secret", "authorization"})


def reference_or_placeholder(value: str) -> bool:
    """Whether an assigned ``value`` is code or a placeholder rather than a secret."""
    stripped = value.strip("\"'`").split(")", 1)[0].rstrip("]},")  # hide_password=False),
    if not stripped or stripped.lower() in _PLACEHOLDERS:
        return True
    if len(set(stripped)) == 1 or stripped.replace("_", "").isdigit():
        return True  # MAX_TOKEN_COUNT = 100_000_000
    # A name in code: self.api_key = api_key, ATTR_TOKEN_TYPE = "gen_ai.token.type".
    if _CODE_NAME.fullmatch(stripped) is not None:
        return True
    return _REFERENCE.match(stripped) is not None


def _looks_like_word(value: str) -> bool:
    """A value a sentence would continue with: letters only (an initial capital at most)."""
    core = value.rstrip(".,;:!?)」。")
    if "-" in core.strip("-") and all(part.isalpha() for part in core.split("-")):
        core = core.replace("-", "")  # "case-sensitive", "single-use": words joined
    return core.isalpha() and (core[1:].islower() or (core.isupper() and len(core) <= 4))


def iban_ok(text: str) -> bool:
    """ISO 13616's check: a known country and its length; the country and check digits moved
    to the end, read as a number, leave 1 modulo 97."""
    compact = text.replace(" ", "").upper()
    if IBAN_LENGTHS.get(compact[:2]) != len(compact) or not compact[2:4].isdigit():
        return False
    moved = compact[4:] + compact[:4]
    number = "".join(str(int(c, 36)) for c in moved)
    return int(number) % 97 == 1


# The prefixes card issuers use (Visa, Mastercard, American Express, Diners, Discover, JCB,
# UnionPay, Maestro): a 13-digit millisecond timestamp (17...) is no card number.
_CARD_ISSUER = re.compile(r"4|5[0-9]|2[2-7]|3[04-9]|6")


def luhn_ok(digits: str) -> bool:
    total = 0
    for position, char in enumerate(reversed(digits)):
        value = ord(char) - 48
        if position % 2 == 1:
            value *= 2
            if value > 9:
                value -= 9
        total += value
    return total % 10 == 0


def plausible(name: str, secret: str, text: str, match: re.Match[str]) -> bool:
    """Checks a pattern cannot express: a checksum, a character mix, a context word, code or
    a placeholder instead of a value."""
    if name in _ASSIGNMENT_KINDS and match.re.groups:
        if reference_or_placeholder(secret) or secret.startswith("//"):
            return False  # "a passphrase manager. See https://...": the colon of a URL
        if "://" in secret and "@" not in secret:
            return False  # OAUTH_REDIRECT_URI=https://...: an address, not a credential
        if name != "password" and secret.isdigit() and len(secret) <= 8:
            return False  # MAX_TOKENS=4096: a count, not a token
        if name == "authorization" and PARAMETER_NAME.match(text, match.start(1)):
            return False  # Digest username="...": a scheme's parameter name, not its value
        operator = text[match.start() : match.start(1)]
        # "password: open Settings", "the secret: rotate credentials": prose, not a value.
        return not (
            "=" not in operator
            and "'" not in operator
            and '"' not in operator
            and _looks_like_word(secret)
        )
    if name == "email":
        domain = secret.rsplit("@", 1)[1]
        if domain.rsplit(".", 1)[1].lower() in FILE_SUFFIXES:
            return False
        # user@host after ssh, scp or rsync is a login, not an address.
        return _REMOTE_LOGIN.search(text, max(0, match.start() - 64), match.start()) is None
    if name == "card_number":
        digits = secret.replace(" ", "").replace("-", "")
        return _CARD_ISSUER.match(digits) is not None and luhn_ok(digits)
    if name == "iban":
        return iban_ok(secret)
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


def decode_base64(text: str) -> str | None:
    """``text`` decoded from base64 when it holds printable UTF-8 text, else ``None``."""
    try:
        raw = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
        decoded = raw.decode("utf-8")
    except (binascii.Error, ValueError):
        return None
    printable = sum(c.isprintable() or c in "\r\n\t" for c in decoded)
    return decoded if printable >= 0.95 * len(decoded) else None


_OTHER_DIGIT = re.compile(r"[^\D0-9]")  # a digit of another script (one class: fast)
# Characters that show nothing (zero-width space, joiners, soft hyphen, word joiner, BOM):
# dropped before matching, so that a key they split is whole again.
INVISIBLE = re.compile("[\u00ad\u180e\u200b-\u200f\u2060-\u2064\ufeff]")
# Cyrillic and Greek letters drawn like Latin ones, folded to them when they stand next to a
# Latin letter (a word of mixed scripts, such as "pаsswоrd" with Cyrillic a and o).
_HOMOGLYPHS = dict(zip("аеорсухіјѕАВЕКМНОРСТХІЈЅο", "aeopcyxijsABEKMHOPCTXIJSo", strict=True))
_MIXED_SCRIPT = re.compile(f"[A-Za-z][{''.join(_HOMOGLYPHS)}]|[{''.join(_HOMOGLYPHS)}][A-Za-z]")
_NON_ASCII = re.compile(r"[^\x00-\x7f]+")
_CHUNK = 1024


def _non_ascii_chunks(text: str) -> list[tuple[int, int]]:
    """The (start, end) of the pieces of ``_CHUNK`` characters of ``text`` that are not all
    ASCII (``str.isascii`` on a piece is far faster than any expression over it): every
    character the folding changes stands in one of them."""
    size = len(text)
    return [
        (start, min(size, start + _CHUNK))
        for start in range(0, size, _CHUNK)
        if not text[start : start + _CHUNK].isascii()
    ]


def normalise(text: str) -> tuple[str, list[int] | None]:
    """``text`` with compatibility forms folded (NFKC: full-width letters and digits, ligatures)
    and every decimal digit of any script made ASCII, invisible characters dropped (``INVISIBLE``)
    and Cyrillic or Greek look-alikes inside a Latin word made Latin, so that the patterns see
    one form; with
    the offset in ``text`` of each character of the result, or ``None`` when the lengths
    agree (offsets are then the same)."""
    chunks = _non_ascii_chunks(text)
    if (
        unicodedata.is_normalized("NFKC", text)
        and not any(_OTHER_DIGIT.search(text, start, end) for start, end in chunks)
        and not any(INVISIBLE.search(text, start, end) for start, end in chunks)
        # A look-alike's Latin neighbour may stand just outside its piece.
        and not any(_MIXED_SCRIPT.search(text, max(0, start - 1), end + 1) for start, end in chunks)
    ):
        return text, None
    pieces: list[str] = []
    lengths: list[tuple[int, int, int]] = []  # (offset in text, characters in text, in result)
    last = 0
    # Each character is folded on its own (a run cut at a piece's end folds the same).
    runs = (run for start, end in chunks for run in _NON_ASCII.finditer(text, start, end))
    for run in runs:
        pieces.append(text[last : run.start()])
        for index in range(run.start(), run.end()):
            char = text[index]
            folded = unicodedata.normalize("NFKC", char)
            if folded.isdecimal() and not folded.isascii():
                folded = "".join(str(unicodedata.decimal(c)) for c in folded)
            elif char.isspace():
                folded = " "
            elif INVISIBLE.match(char):
                folded = ""
            elif char in _HOMOGLYPHS and _next_to_latin(text, index):
                folded = _HOMOGLYPHS[char]
            pieces.append(folded)
            if len(folded) != 1:
                lengths.append((index, 1, len(folded)))
        last = run.end()
    pieces.append(text[last:])
    result = "".join(pieces)
    if not lengths:
        return result, None
    # Offsets in text of each character of the result, then of its end.
    offsets: list[int] = []
    position = 0
    for index, _, size in lengths:
        offsets.extend(range(position, index))
        offsets.extend([index] * size)
        position = index + 1
    offsets.extend(range(position, len(text) + 1))
    return result, offsets


def _next_to_latin(text: str, index: int) -> bool:
    before = text[index - 1 : index]
    after = text[index + 1 : index + 2]
    return (before.isascii() and before.isalpha()) or (after.isascii() and after.isalpha())


def lower(text: str) -> str:
    """``text`` lower-cased with its length kept (offsets in it are offsets in ``text``)."""
    lowered = text.lower()
    if len(lowered) == len(text):
        return lowered
    # Each character on its own (one whose lower case is longer is kept), piece by piece: a
    # piece lower-cased whole is the same where it keeps its length and holds no capital sigma
    # (the one letter str.lower maps by its context).
    pieces = []
    for start in range(0, len(text), _CHUNK):
        piece = text[start : start + _CHUNK]
        folded = piece.lower()
        if len(folded) != len(piece) or "\u03a3" in piece:
            folded = "".join(c if len(c.lower()) != 1 else c.lower() for c in piece)
        pieces.append(folded)
    return "".join(pieces)


_UNDERSCORE_PREFIXES = ("ghp", "gho", "ghu", "ghs", "ghr", "_pat", "hf", "sk", "rk")


# Finding a rare character is a memchr; a two-character substring search is far slower. So the
# vendor prefixes are looked for around each '-' or '_', up to a number of them.
_MAX_SEPARATORS = 64


def vendor_underscore(text: str) -> bool:
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


def vendor_hyphen(text: str) -> bool:
    """Whether a hyphen in ``text`` may follow a vendor key prefix (``sk-``, ``pk-``, ``rk-``,
    ``xoxb-``...)."""
    index = text.find("k-")
    for _ in range(_MAX_SEPARATORS):
        if index < 0:
            return "xox" in text
        if index >= 1 and text[index - 1] in "spr":
            return True
        index = text.find("k-", index + 2)
    return True


def anchored_matches(
    regex: re.Pattern[str], text: str, lowered: str, anchors: tuple[tuple[str, ...], int]
) -> Iterator[re.Match[str]]:
    """The matches of ``regex`` that start at an anchor (or up to ``before`` characters
    before one), in order of their start."""
    words, before = anchors
    starts: set[int] = set()
    found: list[re.Match[str]] = []
    seen = 0
    for word in words:
        position = lowered.find(word)
        while position >= 0:
            seen += 1
            if seen > _MAX_ANCHORS:
                return regex.finditer(text)  # so many anchors that one pass costs less
            if before:
                for match in regex.finditer(
                    text, max(0, position - before), min(len(text), position + 512)
                ):
                    if match.start() <= position < match.end() and match.start() not in starts:
                        starts.add(match.start())
                        found.append(match)
            else:
                at = regex.match(text, position)
                if at is not None and position not in starts:
                    starts.add(position)
                    found.append(at)
            position = lowered.find(word, position + 1)
    found.sort(key=lambda match: match.start())
    return iter(found)


# Anchors looked at one by one in one text, at most.
_MAX_ANCHORS = 256


def continued(text: str, end: int) -> int:
    """The end of a token that a line break or a space split: its continuation is joined when
    it is a run of token characters holding both a letter and a digit."""
    more = CONTINUATION.match(text, end)
    if more is None:
        return end
    piece = more.group(1)
    if any(c.isdigit() for c in piece) and any(c.isalpha() for c in piece):
        return more.end(1)
    return end
