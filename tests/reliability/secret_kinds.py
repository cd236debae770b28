"""A corpus of kinds of secrets and personal data, each a format-valid fake.

Two parts: one example of every rule of the rule files the scrubber ships (gitleaks' rules and
its own), generated from the rule's expression (``regex_examples``); and the shapes a rule list
misses: split, wrapped, percent- or base64-encoded, full-width or Arabic-Indic, in other
languages and scripts. Each kind is a text to plant and the pieces of it that must never be
stored (``needles``). Nothing here is a real secret."""

from __future__ import annotations

import base64
import random
import re
import string
from dataclasses import dataclass

from recalltrace.tracer._scrub._ruleset import BUILTIN_RULE_FILES, RuleFileSet
from tests.reliability.regex_examples import example


@dataclass(frozen=True)
class Kind:
    name: str
    text: str
    """The text planted (the secret with the context its format needs)."""
    needles: tuple[str, ...]
    """What must not appear anywhere afterwards: the secret, or each piece of a split one."""


_RNG = random.Random(20261126)
_NOTE = re.compile(r"scrubbed \w+ in")
_ALNUM = string.ascii_letters + string.digits


def _chars(count: int, alphabet: str = _ALNUM) -> str:
    return "".join(_RNG.choice(alphabet) for _ in range(count))


def _hex(count: int) -> str:
    return _chars(count, "0123456789abcdef")


def _luhn_complete(prefix: str) -> str:
    """``prefix`` with the check digit that makes it pass Luhn's check."""
    for digit in "0123456789":
        number = prefix + digit
        total = 0
        for position, char in enumerate(reversed(number)):
            value = int(char) * (2 if position % 2 else 1)
            total += value - 9 if value > 9 else value
        if total % 10 == 0:
            return number
    raise AssertionError("unreachable")


def _iban(country: str, bban: str) -> str:
    moved = bban + country + "00"
    check = 98 - int("".join(str(int(c, 36)) for c in moved)) % 97
    return f"{country}{check:02d}{bban}"


_FULL_WIDTH = {c: chr(ord(c) + 0xFEE0) for c in string.ascii_letters + string.digits + "-_"}
_ARABIC_INDIC = {str(d): chr(0x0660 + d) for d in range(10)}


def _widen(text: str) -> str:
    return "".join(_FULL_WIDTH.get(c, "\u3000" if c == " " else c) for c in text)


def _arabic_indic(text: str) -> str:
    return "".join(_ARABIC_INDIC.get(c, c) for c in text)


def rule_file_kinds() -> list[Kind]:
    """One example per rule of the shipped rule files (rules whose expression the generator
    cannot satisfy, or whose examples the rule's own allowlists exempt, are left out)."""
    files = RuleFileSet(BUILTIN_RULE_FILES)
    kinds = []
    for index, rule in enumerate(files.rules):
        for seed in range(index * 7, index * 7 + 7):
            found = example(rule.regex, seed)
            if found is None:
                continue
            start, end = rule.secret_span(found)
            secret = found.string[start:end]
            if len(secret) < 8 or rule.allowed(secret, found.group(), found.string, files):
                continue
            text = found.group()
            if not any(keyword in text.lower() for keyword in rule.keywords):
                text = f"{rule.keywords[0]} {text}"  # the rule needs its keyword nearby
            kinds.append(Kind(f"rule:{rule.name}", text, (secret,)))
            break
    return kinds


def _variants() -> list[Kind]:
    openai = "sk-proj-" + _chars(48)
    github = "ghp_" + _chars(36)
    slack = "xoxb-" + "-".join((_chars(11, string.digits), _chars(12, string.digits), _chars(24)))
    card = _luhn_complete("45394810" + _chars(7, string.digits))
    card_spaced = " ".join(card[i : i + 4] for i in range(0, 16, 4))
    card2 = _luhn_complete("51055105" + _chars(7, string.digits))
    iban_de = _iban("DE", _chars(18, string.digits))
    iban_gb = _iban("GB", "NWBK" + _chars(14, string.digits))
    env_file = (
        f"DB_PASSWORD=Zq8-lmT3!x{_chars(4)}\nSTRIPE_KEY=sk_live_{_chars(24)}\n"
        f"SENTRY_DSN=https://{_hex(32)}@o1.ingest.example.io/42\n"
    )
    env_b64 = base64.b64encode(env_file.encode()).decode()
    docker_auth = base64.b64encode(f"deploy:S3cret-{_chars(10)}".encode()).decode()
    pem_body = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC" + _chars(32, _ALNUM + "+/")
    pem_line2 = _chars(64, _ALNUM + "+/")
    pgp_body = "lQOYBGVa" + _chars(56, _ALNUM + "+/")
    openssh_body = "b3BlbnNzaC1rZXktdjEAAAAA" + _chars(40, _ALNUM + "+/")
    jwt = (
        "eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCJ9."
        + "eyJzdWIiOi"
        + _chars(40, _ALNUM + "-_")
        + "."
        + _chars(43, _ALNUM + "-_")
    )
    azure_sb_key = _chars(43, _ALNUM + "+/") + "="
    age = "AGE-SECRET-KEY-1" + _chars(58, "QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L")
    url_pw = "P%40ssw0rd-" + _chars(6)
    pct_pw = "p%40ss%2Fw0rd-" + _chars(5, string.digits)
    split_key = "sk-proj-" + _chars(40)
    curl_pw = "Xk9#pQ2z" + _chars(3)
    iban_de_spaced = " ".join(iban_de[i : i + 4] for i in range(0, 22, 4))
    ja_pw = f"Sakura{_chars(4, string.digits)}!"
    conn_pw = "Hx7$kq" + _chars(3)
    return [
        Kind("stripe_webhook_secret", f"STRIPE_WEBHOOK: whsec_{_chars(32)}", ()),
        Kind("google_oauth_client_secret", f"client secret GOCSPX-{_chars(28, _ALNUM + '-_')}", ()),
        Kind("google_access_token", f"access token ya29.a0{_chars(80, _ALNUM + '-_')}", ()),
        Kind("google_refresh_token", f"refresh token 1//0g{_chars(60, _ALNUM + '-_')}", ()),
        Kind("databricks_token", f"workspace token dapi{_hex(32)}", ()),
        Kind("digitalocean_token", f"doctl auth init -t dop_v1_{_hex(64)}", ()),
        Kind("pypi_token", f"twine upload -p pypi-AgEIcHlwaS5vcmc{_chars(70, _ALNUM + '-_')}", ()),
        Kind("telegram_bot_token", f"bot {_chars(10, string.digits)}:AA{_chars(33)}", ()),
        Kind("grafana_cloud_token", f"grafana glc_{_chars(48, _ALNUM + '+/')}", ()),
        Kind("age_secret_key", f"# created: 2026-01-05\n{age}", (age,)),
        Kind("square_access_token", f"square EAAA{_chars(60, _ALNUM + '-_')}", ()),
        Kind("square_oauth_token", f"square sq0atp-{_chars(22, _ALNUM + '-_')}", ()),
        Kind("jwt", f"id_token={jwt}", (jwt,)),
        Kind("jwt_in_header", f"X-Auth: {jwt}", (jwt,)),
        Kind(
            "aws_session_token",
            f"session FwoGZXIvYXdzE{_chars(150, _ALNUM + '+/')}",
            (),
        ),
        Kind(
            "pgp_private_key_block",
            f"-----BEGIN PGP PRIVATE KEY BLOCK-----\n\n{pgp_body}\n{pem_line2}\n=Xq2P\n"
            "-----END PGP PRIVATE KEY BLOCK-----",
            (pgp_body, pem_line2),
        ),
        Kind(
            "pem_cut_before_end",
            f"-----BEGIN PRIVATE KEY-----\n{pem_body}\n{pem_line2}",
            (pem_body, pem_line2),
        ),
        Kind(
            "openssh_private_key",
            f"-----BEGIN OPENSSH PRIVATE KEY-----\n{openssh_body}\n"
            "-----END OPENSSH PRIVATE KEY-----",
            (openssh_body,),
        ),
        Kind(
            "pem_in_json_string",
            f'{{"private_key": "-----BEGIN RSA PRIVATE KEY-----\\n{pem_body}\\n'
            '-----END RSA PRIVATE KEY-----\\n"}',
            (pem_body,),
        ),
        Kind(
            "azure_service_bus",
            "Endpoint=sb://acme-prod.servicebus.windows.net/;SharedAccessKeyName="
            f"RootManageSharedAccessKey;SharedAccessKey={azure_sb_key}",
            (azure_sb_key,),
        ),
        Kind(
            "curl_user_password",
            f"curl -u deploy:{curl_pw} https://ci.example.com/api/json",
            (curl_pw,),
        ),
        Kind("card_full_width", f"カード {_widen(card_spaced)}", (_widen(card_spaced),)),
        Kind("card_arabic_indic", f"البطاقة {_arabic_indic(card)}", (_arabic_indic(card),)),
        Kind("card_plain", f"card {card2}", (card2,)),
        Kind("ssn_full_width", f"SSN {_widen('219-09-9999')}", (_widen("219-09-9999"),)),
        Kind("ssn_arabic_indic", f"SSN {_arabic_indic('219-09-9999')}", ()),
        Kind("iban_compact_lower", f"iban {iban_gb.lower()}", (iban_gb.lower(),)),
        Kind("iban_spaced", f"IBAN {iban_de_spaced}", (iban_de_spaced,)),
        Kind("email_idn_domain", "Kontakt: jürgen.müller@bücher-beispiel.de", ()),
        Kind("email_idn_script", "联系 用户名@例子.广告 谢谢", ("用户名@例子.广告",)),
        Kind(
            "email_quoted_local",
            'write to "john q. public"@example.org today',
            ('"john q. public"@example.org',),
        ),
        Kind(
            "key_split_by_newline",
            f"OPENAI_KEY:\n{split_key[:30]}\n{split_key[30:]}",
            (split_key[:30], split_key[30:]),
        ),
        Kind(
            "key_split_by_space",
            f"token {github[:34]} {github[34:]}x9",
            (github[:34],),
        ),
        Kind(
            "url_encoded_credentials",
            "https://sso.example.com/login?next=https%3A%2F%2Fsvc-admin%3A"
            f"{url_pw}%40internal.example.com%2Fadmin",
            (url_pw,),
        ),
        Kind("url_percent_password", f"postgresql://app:{pct_pw}@db.internal:5432/kb", (pct_pw,)),
        Kind("base64_env_file", f"env (base64): {env_b64}", (env_b64,)),
        Kind(
            "docker_auth",
            f'{{"auths": {{"registry.example.com": {{"auth": "{docker_auth}"}}}}}}',
            (docker_auth,),
        ),
        Kind("openai_full_width", f"キー {_widen(openai)}", (_widen(openai),)),
        Kind("slack_split_by_newline", f"bot token {slack[:30]}\n{slack[30:]}", (slack[:30],)),
        Kind("password_phrase_en", f"the password is Tr0ub4dor&{_chars(3)}", ()),
        Kind(
            "password_phrase_en_for",
            f"The password for the staging DB is now Blue-Falcon-{_chars(3, string.digits)}",
            (),
        ),
        Kind("password_phrase_de", f"Das Passwort lautet Sommer{_chars(4, string.digits)}!", ()),
        Kind("password_phrase_de_ist", f"das Passwort ist Kx7#mP{_chars(4)}", ()),
        Kind("password_phrase_fr", f"le mot de passe est Soleil-{_chars(4, string.digits)}", ()),
        Kind("password_phrase_es", f"la contraseña es Gato*Negro{_chars(3, string.digits)}", ()),
        Kind("password_phrase_ja", f"パスワードは「{ja_pw}」です", (ja_pw,)),
        Kind("password_phrase_ru", f"пароль: Moskva-{_chars(5, string.digits)}x", ()),
        Kind(
            "password_phrase_ru_dash", f"Пароль от сервера — Qwerty!{_chars(4, string.digits)}", ()
        ),
        Kind("password_yaml", f"password: Zx9!kQ2m{_chars(3)}", ()),
        Kind(
            "connection_string_password",
            f"Server=tcp:db.example.net;User ID=app;Password={conn_pw};",
            (conn_pw,),
        ),
        Kind("npmrc_token", f"//registry.npmjs.org/:_authToken=npm_{_chars(36)}", ()),
        Kind("bearer_header", f"Authorization: Bearer {_chars(40, _ALNUM + '-._~')}", ()),
        Kind("env_file_line", f"SLACK_SIGNING_SECRET={_hex(32)}", ()),
        Kind("phone_international", "ring +49 30 901820 55 after 6", ("+49 30 901820 55",)),
        Kind("card_in_hex_free_text", f"charged {card_spaced} on 2026-11-02", (card_spaced,)),
    ]


def _needles(kind: Kind) -> Kind:
    """A variant without explicit needles must not leak the part after its context words:
    its last whitespace-separated token(s) that hold a digit or a symbol."""
    if kind.needles:
        return kind
    tail = kind.text.split()[-1].strip("」です!;.")
    for word in reversed(kind.text.split()):
        if any(c.isdigit() for c in word) and len(word) >= 8:
            tail = word
            break
    for prefix in ("-t", "-p"):
        tail = tail.removeprefix(prefix)
    tail = tail.split("=", 1)[-1] if tail.count("=") == 1 and not tail.endswith("=") else tail
    tail = tail.rstrip(";!")
    return Kind(kind.name, kind.text, (tail,))


def all_kinds() -> list[Kind]:
    return rule_file_kinds() + [_needles(kind) for kind in _variants()]


def leaked_kinds(haystack: str, kinds: list[Kind]) -> list[str]:
    """The kinds any 12 characters of whose needles (the whole needle when shorter) appear in
    ``haystack``: a rule that redacts only part of a secret leaks the rest."""
    # A note names the kind it redacted ("scrubbed gitlab_session_cookie in ..."), and a
    # kind's name may spell its format's fixed prefix: notes are read without the names.
    haystack = _NOTE.sub("scrubbed <kind> in", haystack)
    found = []
    for kind in kinds:
        for needle in kind.needles:
            windows = [needle[i : i + 12] for i in range(max(1, len(needle) - 11))]
            if any(window in haystack for window in windows):
                found.append(kind.name)
                break
    return found
