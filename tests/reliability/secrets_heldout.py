"""A held-out corpus of secrets and personal data, written without looking at the rule files or
the scrubber's patterns: the shapes secrets take in real documents, grouped by family (vendor
tokens, configuration syntaxes, keys, authentication, personal identifiers, disguised forms).

Each kind is planted in several positions (``POSITIONS``: start of a text, mid sentence, a JSON
value, a log line, a code block, after a line break, a markdown table cell) and is caught when
it leaks from none of them (``secret_kinds.leaked_kinds``: no 12 characters of a needle remain;
a needle shorter than that, such as a social security number, must not remain at all).

A subset is HELD OUT (``Kind.held_out``): those kinds were written first and set aside, and the
generic detectors (``tracer/_scrub/_generic.py``) were tuned only on the others. Recall is
reported on both (``python -m tests.reliability.secrets_heldout``). Nothing here is a real
secret: every value is generated or a published example."""

from __future__ import annotations

import base64
import html
import json
import random
import string
import sys
import urllib.parse
from dataclasses import dataclass

from stdnum import verhoeff
from stdnum.iso7064 import mod_11_10

from tests.reliability.secret_kinds import Kind as _PlainKind
from tests.reliability.secret_kinds import leaked_kinds


@dataclass(frozen=True)
class Kind:
    family: str
    name: str
    text: str
    """The text planted: the secret with the context it is usually found in."""
    needles: tuple[str, ...]
    """What must not remain: the secret (or each piece of a split one)."""
    held_out: bool = False


_RNG = random.Random(20261129)
_ALNUM = string.ascii_letters + string.digits
_B64 = _ALNUM + "+/"
_URLSAFE = _ALNUM + "-_"


def _c(count: int, alphabet: str = _ALNUM) -> str:
    return "".join(_RNG.choice(alphabet) for _ in range(count))


def _hex(count: int) -> str:
    return _c(count, "0123456789abcdef")


def _digits(count: int) -> str:
    return _c(count, string.digits)


def _uuid() -> str:
    h = _hex(32)
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-a{h[17:20]}-{h[20:]}"


def _password() -> str:
    return _c(5, string.ascii_letters) + _c(1, "#!%*") + _digits(2) + _c(4, _ALNUM) + "$" + _c(2)


def _luhn(prefix: str) -> str:
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


def _groups(text: str, size: int = 4, sep: str = " ") -> str:
    return sep.join(text[i : i + size] for i in range(0, len(text), size))


def _k(family: str, name: str, text: str, *needles: str, held_out: bool = False) -> Kind:
    return Kind(family, name, text, needles, held_out)


# -- held out: written first, set aside ----------------------------------------------------------


def _held_out() -> list[Kind]:
    v, cf, ke, au, pi, di = "vendor", "config", "keys", "auth", "personal", "disguised"
    pinecone = "pcsk_" + _c(6) + "_" + _c(60)
    replicate = "r8_" + _c(37)
    groq = "gsk_" + _c(52)
    langsmith = "lsv2_pt_" + _hex(32) + "_" + _hex(10)
    mistral = _c(32)
    wandb = _hex(40)
    dockerhub = "dckr_pat_" + _c(27, _URLSAFE)
    supabase = "sbp_" + _hex(40)
    deepgram = _hex(40)
    twilio_sid, twilio_token = "AC" + _hex(32), _hex(32)
    pw1, pw2, pw3, pw4 = _password(), _password(), _password(), _password()
    tf_secret = _c(40, _B64)
    k8s_value = base64.b64encode(_password().encode()).decode()
    xml_pw = _password()
    props_pw = _password()
    ec_body = "MHcCAQEEI" + _c(56, _B64)
    ec_line2 = _c(64, _B64)
    jwk_d = _c(43, _URLSAFE)
    putty_body = _c(64, _B64)
    digest_response = _hex(32)
    api_header = _c(40)
    cookie_session = _c(32, _URLSAFE)
    mongo_pw = _password()
    amqp_pw = _password()
    fr_nir = "2690549588157"
    fr_nir += f"{97 - int(fr_nir) % 97:02d}"
    de_id = "8609574271" + mod_11_10.calc_check_digit("8609574271")
    aadhaar = "4956 7812 342"
    aadhaar = aadhaar + verhoeff.calc_check_digit(aadhaar.replace(" ", ""))
    card_amex = "3782 822463 10005"
    iban_nl = _iban("NL", "ABNA" + _digits(10))
    ghp = "ghp_" + _c(36)
    openai = "sk-proj-" + _c(48)
    hex_secret = "SECRET_KEY=" + _c(24)
    html_token = "token: " + _c(28)
    zw_key = "AKIA" + _c(16, string.ascii_uppercase + string.digits)
    return [
        _k(v, "pinecone_key", f"PINECONE_API_KEY={pinecone}", pinecone, held_out=True),
        _k(
            v,
            "replicate_token",
            f"export REPLICATE_API_TOKEN={replicate}",
            replicate,
            held_out=True,
        ),
        _k(v, "groq_key", f'client = Groq(api_key="{groq}")', groq, held_out=True),
        _k(v, "langsmith_key", f"LANGCHAIN_API_KEY: {langsmith}", langsmith, held_out=True),
        _k(v, "mistral_key", f"mistral api key {mistral}", mistral, held_out=True),
        _k(v, "wandb_key", f"wandb login {wandb}", wandb, held_out=True),
        _k(
            v,
            "dockerhub_pat",
            f"docker login -u acme --password {dockerhub}",
            dockerhub,
            held_out=True,
        ),
        _k(v, "supabase_pat", f"SUPABASE_ACCESS_TOKEN='{supabase}'", supabase, held_out=True),
        _k(v, "deepgram_key", f"Authorization: Token {deepgram}", deepgram, held_out=True),
        _k(
            v,
            "twilio_client",
            f"client = Client('{twilio_sid}', '{twilio_token}')",
            twilio_token,
            held_out=True,
        ),
        _k(
            cf,
            "toml_password",
            f'[database]\nhost = "db.internal"\npassword = "{pw1}"',
            pw1,
            held_out=True,
        ),
        _k(cf, "ini_password", f"[smtp]\nuser = mailer\npass = {pw2}", pw2, held_out=True),
        _k(
            cf,
            "terraform_secret",
            f'resource "x" "y" {{\n  client_secret = "{tf_secret}"\n}}',
            tf_secret,
            held_out=True,
        ),
        _k(
            cf,
            "k8s_secret_data",
            f"kind: Secret\ndata:\n  db-password: {k8s_value}",
            k8s_value,
            held_out=True,
        ),
        _k(
            cf,
            "xml_password",
            f"<datasource><password>{xml_pw}</password></datasource>",
            xml_pw,
            held_out=True,
        ),
        _k(
            cf, "java_properties", f"spring.datasource.password={props_pw}", props_pw, held_out=True
        ),
        _k(
            cf,
            "compose_env",
            f"    environment:\n      - MYSQL_ROOT_PASSWORD={pw3}",
            pw3,
            held_out=True,
        ),
        _k(cf, "php_define", f"define('DB_PASSWORD', '{pw4}');", pw4, held_out=True),
        _k(
            ke,
            "ec_private_key",
            f"-----BEGIN EC PRIVATE KEY-----\n{ec_body}\n{ec_line2}\n-----END EC PRIVATE KEY-----",
            ec_body,
            ec_line2,
            held_out=True,
        ),
        _k(
            ke,
            "jwk_private",
            f'{{"kty":"EC","crv":"P-256","d":"{jwk_d}","x":"abc"}}',
            jwk_d,
            held_out=True,
        ),
        _k(
            ke,
            "putty_key",
            f"PuTTY-User-Key-File-3: ssh-ed25519\nPrivate-Lines: 1\n{putty_body}",
            putty_body,
            held_out=True,
        ),
        _k(
            au,
            "digest_auth",
            f'Authorization: Digest username="ops", realm="api", nonce="dcd98b", '
            f'response="{digest_response}"',
            digest_response,
            held_out=True,
        ),
        _k(au, "x_api_key_header", f"X-API-Key: {api_header}", api_header, held_out=True),
        _k(
            au,
            "set_cookie",
            f"Set-Cookie: __Host-session={cookie_session}; Path=/; Secure",
            cookie_session,
            held_out=True,
        ),
        _k(
            au,
            "mongodb_uri",
            f"mongodb+srv://app:{mongo_pw}@cluster0.example.net/db",
            mongo_pw,
            held_out=True,
        ),
        _k(
            au,
            "amqp_uri",
            f"BROKER_URL=amqp://worker:{amqp_pw}@rabbit:5672//",
            amqp_pw,
            held_out=True,
        ),
        _k(pi, "fr_nir", f"numéro de sécurité sociale : {fr_nir}", fr_nir, held_out=True),
        _k(pi, "de_steuer_id", f"Steuer-ID {de_id}", de_id, held_out=True),
        _k(pi, "in_aadhaar", f"Aadhaar no. {aadhaar}", aadhaar, held_out=True),
        _k(
            pi,
            "it_codice_fiscale",
            "codice fiscale RSSMRA85T10A562S",
            "RSSMRA85T10A562S",
            held_out=True,
        ),
        _k(pi, "amex_spaced", f"Amex {card_amex}", card_amex, held_out=True),
        _k(
            pi,
            "iban_nl_lower_spaced",
            f"rekening {_groups(iban_nl.lower())}",
            _groups(iban_nl.lower()),
            held_out=True,
        ),
        _k(pi, "phone_gb", "call me on +44 20 7946 0958", "+44 20 7946 0958", held_out=True),
        _k(pi, "phone_de_mobile", "Handy: 0151 23456789", "0151 23456789", held_out=True),
        _k(pi, "phone_jp_national", "電話 090-1234-5678", "090-1234-5678", held_out=True),
        _k(pi, "passport_us", "passport number C03005988", "C03005988", held_out=True),
        _k(
            di,
            "ghp_split_spaces",
            f"token {ghp[:12]} {ghp[12:24]} {ghp[24:]}",
            ghp[:12] + " " + ghp[12:24],
            held_out=True,
        ),
        _k(
            di,
            "openai_zero_width",
            "key " + "\u200b".join(openai[i : i + 8] for i in range(0, len(openai), 8)),
            openai[8:16] + "\u200b" + openai[16:24],
            held_out=True,
        ),
        _k(
            di,
            "hex_encoded_env",
            f"payload {hex_secret.encode().hex()}",
            hex_secret.encode().hex(),
            held_out=True,
        ),
        _k(
            di,
            "html_entities",
            "<p>" + "".join(f"&#{ord(c)};" for c in html_token) + "</p>",
            "".join(f"&#{ord(c)};" for c in html_token[7:19]),
            held_out=True,
        ),
        _k(
            di,
            "aws_zero_width_joiner",
            "id: " + "\u200d".join(zw_key),
            "\u200d".join(zw_key),
            held_out=True,
        ),
    ]


# -- tuning set: the detectors were written against these ----------------------------------------


def _tuning() -> list[Kind]:
    v, cf, ke, au, pi, di = "vendor", "config", "keys", "auth", "personal", "disguised"
    okta = "00" + _c(40, _URLSAFE)
    sigv4 = _hex(64)
    ld = "sdk-" + _uuid()
    together = _hex(64)
    voyage = "pa-" + _c(43, _URLSAFE)
    jina = "jina_" + _hex(32) + _c(28)
    fireworks = "fw_" + _c(24)
    elevenlabs = "sk_" + _hex(48)
    vercel = _c(24)
    render = "rnd_" + _c(32)
    figma = "figd_" + _c(40, _URLSAFE)
    circleci = "CCIPAT_" + _c(22) + "_" + _hex(40)
    neon = "napi_" + _c(64).lower()
    resend = "re_" + _c(8) + "_" + _c(24)
    postmark = _uuid()
    azure_openai = _hex(32)
    firebase = "AAAA" + _c(7, _URLSAFE) + ":APA91b" + _c(134, _URLSAFE)
    cloudinary_secret = _c(27, _URLSAFE)
    braintree = "access_token$production$" + _c(16).lower() + "$" + _hex(32)
    modal = "as-" + _c(22)
    pw = [_password() for _ in range(16)]
    yaml_secret = _c(32)
    env_json = _c(40, _URLSAFE)
    dotnet = _c(44, _B64)
    rsa_body = "MIIEpAIBAAKCAQEA" + _c(48, _B64)
    rsa_line2 = _c(64, _B64)
    enc_body = "MIIFHzBJBgkqhkiG9w0BBQ0wPDAbBgkqhkiG" + _c(28, _B64)
    ssh_body = "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ" + _c(30, _B64)
    pgp_body = "lQdGBF" + _c(58, _B64)
    jwk_rsa = _c(86, _URLSAFE)
    ppk2 = _c(64, _B64)
    ssws = "00" + _c(40, _URLSAFE)
    token_header = _c(40)
    basic = base64.b64encode(f"admin:{_password()}".encode()).decode()
    cookie = _c(32).lower()
    cli_token = "b19A" + _c(36)
    cli_w = "Pxe#" + _c(10)
    mysql_p = _password()
    redis_pw = _c(24)
    jdbc_pw = _password()
    psql_pw = _password()
    hmac_sig = _hex(64)
    api_q = _c(32)
    iban_fr = _iban("FR", _digits(10) + _c(11, string.ascii_uppercase + string.digits) + "12")
    iban_de = _iban("DE", _digits(18))
    iban_es = _iban("ES", _digits(20))
    card_visa = _luhn("4111" + _digits(11))
    card_mc = _luhn("5425" + _digits(11))
    aadhaar = "2345 6789 012"
    ghp = "ghp_" + _c(36)
    slack = "xoxb-" + _digits(11) + "-" + _digits(12) + "-" + _c(24)
    escaped_pw = _password()
    b64_token = "OPENAI_API_KEY=sk-proj-" + _c(40)
    url_token = "password=" + _password()
    full_width_pw = _password()
    homoglyph_pw = _password()
    stripe = "sk_live_" + _c(24)
    json_escaped = "ghp_" + _c(36)
    return [
        _k(v, "okta_ssws", f"Authorization: SSWS {okta}", okta),
        _k(
            v,
            "aws_sigv4",
            "Authorization: AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261129/us-east-1/s3/"
            f"aws4_request, SignedHeaders=host;x-amz-date, Signature={sigv4}",
            sigv4,
        ),
        _k(v, "launchdarkly_sdk", f"LD_SDK_KEY={ld}", ld),
        _k(v, "together_key", f"TOGETHER_API_KEY={together}", together),
        _k(v, "voyage_key", f"voyageai.Client(api_key='{voyage}')", voyage),
        _k(v, "jina_key", f"Bearer {jina}", jina),
        _k(v, "fireworks_key", f'FIREWORKS_API_KEY: "{fireworks}"', fireworks),
        _k(v, "elevenlabs_key", f"xi-api-key: {elevenlabs}", elevenlabs),
        _k(v, "vercel_token", f"vercel deploy --token {vercel}", vercel),
        _k(v, "render_key", f"RENDER_API_KEY={render}", render),
        _k(v, "figma_token", f"X-Figma-Token: {figma}", figma),
        _k(v, "circleci_pat", f"Circle-Token: {circleci}", circleci),
        _k(v, "neon_key", f"NEON_API_KEY={neon}", neon),
        _k(v, "resend_key", f'resend = Resend("{resend}")', resend),
        _k(v, "postmark_token", f"X-Postmark-Server-Token: {postmark}", postmark),
        _k(v, "azure_openai_key", f"api-key: {azure_openai}", azure_openai),
        _k(v, "firebase_server_key", f"key={firebase}", firebase),
        _k(
            v,
            "cloudinary_url",
            f"CLOUDINARY_URL=cloudinary://123456789012345:{cloudinary_secret}@acme",
            cloudinary_secret,
        ),
        _k(v, "braintree_token", f"gateway token {braintree}", braintree),
        _k(v, "modal_secret", f"modal token set --token-secret {modal}", modal),
        _k(cf, "yaml_nested", f"database:\n  credentials:\n    secret: {yaml_secret}", yaml_secret),
        _k(cf, "yaml_quoted", f"db_password: '{pw[0]}'", pw[0]),
        _k(cf, "env_export", f'export DATABASE_PASSWORD="{pw[1]}"', pw[1]),
        _k(cf, "json_config", f'{{"smtp": {{"user": "ops", "pass": "{pw[2]}"}}}}', pw[2]),
        _k(cf, "json_token_camel", f'{{"accessToken": "{env_json}"}}', env_json),
        _k(cf, "ini_db", f"[postgres]\nhost=db\npassword={pw[3]}", pw[3]),
        _k(
            cf,
            "dotnet_appsettings",
            f'"ConnectionStrings": {{"Main": "Server=db;Database=app;User Id=sa;'
            f'Password={pw[4]};"}}',
            pw[4],
        ),
        _k(cf, "xml_attribute", f'<add key="ApiSecret" value="{dotnet}" />', dotnet),
        _k(cf, "terraform_password", f'  admin_password = "{pw[5]}"', pw[5]),
        _k(cf, "helm_values", f"redis:\n  auth:\n    password: {pw[6]}", pw[6]),
        _k(cf, "php_array", f"'password' => '{pw[7]}',", pw[7]),
        _k(cf, "ruby_hash", f'config.secret_key_base = "{_hex(40)}"', ""),
        _k(cf, "go_struct", f'cfg := Config{{Password: "{pw[8]}"}}', pw[8]),
        _k(
            ke,
            "rsa_private",
            f"-----BEGIN RSA PRIVATE KEY-----\n{rsa_body}\n{rsa_line2}\n"
            "-----END RSA PRIVATE KEY-----",
            rsa_body,
            rsa_line2,
        ),
        _k(
            ke,
            "encrypted_private",
            f"-----BEGIN ENCRYPTED PRIVATE KEY-----\n{enc_body}\n"
            "-----END ENCRYPTED PRIVATE KEY-----",
            enc_body,
        ),
        _k(
            ke,
            "openssh_private",
            f"-----BEGIN OPENSSH PRIVATE KEY-----\n{ssh_body}\n-----END OPENSSH PRIVATE KEY-----",
            ssh_body,
        ),
        _k(
            ke,
            "pgp_private",
            f"-----BEGIN PGP PRIVATE KEY BLOCK-----\n\n{pgp_body}\n"
            "-----END PGP PRIVATE KEY BLOCK-----",
            pgp_body,
        ),
        _k(
            ke,
            "jwk_rsa_private",
            f'{{"kty": "RSA", "n": "sXch", "e": "AQAB", "d": "{jwk_rsa}"}}',
            jwk_rsa,
        ),
        _k(ke, "putty_v2", f"PuTTY-User-Key-File-2: ssh-rsa\nPrivate-Lines: 1\n{ppk2}", ppk2),
        _k(au, "ssws_header", f"curl -H 'Authorization: SSWS {ssws}' https://acme.okta.com", ssws),
        _k(au, "token_scheme", f"Authorization: token {token_header}", token_header),
        _k(au, "basic_header", f"Authorization: Basic {basic}", basic),
        _k(au, "cookie_header", f"Cookie: sessionid={cookie}; csrftoken=abc", cookie),
        _k(au, "cli_token_flag", f"deploy --token {cli_token} --env prod", cli_token),
        _k(au, "cli_w_flag", f"ldapsearch -x -D cn=admin -w '{cli_w}' -b dc=acme", cli_w),
        _k(au, "mysql_p_flag", f"mysql -u root -p{mysql_p} app", mysql_p),
        _k(au, "redis_cli", f"redis-cli -h cache -a {redis_pw} ping", redis_pw),
        _k(au, "jdbc_url", f"jdbc:postgresql://db:5432/app?user=app&password={jdbc_pw}", jdbc_pw),
        _k(au, "psql_env", f"PGPASSWORD={psql_pw} psql -h db -U app", psql_pw),
        _k(au, "hmac_signature", f"X-Hub-Signature-256: sha256={hmac_sig}", hmac_sig),
        _k(au, "api_key_query", f"GET /v1/search?q=rag&api_key={api_q} HTTP/1.1", api_q),
        _k(pi, "card_dots", f"card {_groups(card_visa, 4, '.')}", _groups(card_visa, 4, ".")),
        _k(pi, "card_compact_json", f'{{"pan": "{card_mc}"}}', card_mc),
        _k(pi, "iban_fr_lower", f"iban {_groups(iban_fr.lower())}", _groups(iban_fr.lower())),
        _k(pi, "iban_de_compact", f"IBAN: {iban_de}", iban_de),
        _k(pi, "iban_es_spaced", f"cuenta {_groups(iban_es)}", _groups(iban_es)),
        _k(pi, "ssn_no_dashes", "SSN 536904399", "536904399"),
        _k(pi, "ssn_dots", "social security number 536.90.4399", "536.90.4399"),
        _k(pi, "br_cpf", "CPF 390.533.447-05", "390.533.447-05"),
        _k(pi, "es_dni", "DNI 12345678Z", "12345678Z"),
        _k(pi, "nl_bsn", "BSN 111222333", "111222333"),
        _k(pi, "cn_ric", "身份证号 11010519491231002X", "11010519491231002X"),
        _k(pi, "se_personnummer", "personnummer 811228-9874", "811228-9874"),
        _k(pi, "pl_pesel", "PESEL 44051401359", "44051401359"),
        _k(pi, "ca_sin", "SIN 046 454 286", "046 454 286"),
        _k(pi, "uk_nino", "National Insurance number QQ 12 34 56 C", "QQ 12 34 56 C"),
        _k(
            pi,
            "in_aadhaar_bad_check_ok",
            f"Aadhaar {aadhaar}{verhoeff.calc_check_digit(aadhaar.replace(' ', ''))}",
            aadhaar + verhoeff.calc_check_digit(aadhaar.replace(" ", "")),
        ),
        _k(pi, "phone_fr_intl", "tél. +33 6 12 34 56 78", "+33 6 12 34 56 78"),
        _k(pi, "phone_fr_national", "appelez le 06 12 34 56 78", "06 12 34 56 78"),
        _k(pi, "phone_jp_intl", "携帯 +81 90-1234-5678", "+81 90-1234-5678"),
        _k(pi, "phone_in", "mobile +91 98765 43210", "+91 98765 43210"),
        _k(pi, "phone_br", "celular +55 11 91234-5678", "+55 11 91234-5678"),
        _k(pi, "phone_au_national", "mobile 0412 345 678", "0412 345 678"),
        _k(pi, "passport_gb", "Passport No: 925076473", "925076473"),
        _k(di, "ghp_split_newline", f"token {ghp[:20]}\n{ghp[20:]}", ghp[:20]),
        _k(di, "slack_split_space", f"slack {slack[:25]} {slack[25:]}", slack[:25]),
        _k(di, "json_escaped_pw", json.dumps(json.dumps({"password": escaped_pw})), escaped_pw),
        _k(
            di,
            "base64_env_line",
            f"blob: {base64.b64encode(b64_token.encode()).decode()}",
            base64.b64encode(b64_token.encode()).decode(),
        ),
        _k(
            di,
            "url_encoded_pw",
            f"next={urllib.parse.quote(url_token)}",
            urllib.parse.quote(url_token)[12:],
        ),
        _k(
            di,
            "full_width_pw",
            "ｐａｓｓｗｏｒｄ： "
            + "".join(chr(ord(c) + 0xFEE0) if c.isalnum() else c for c in full_width_pw),
            "".join(chr(ord(c) + 0xFEE0) if c.isalnum() else c for c in full_width_pw),
        ),
        _k(di, "homoglyph_password", f"pаsswоrd={homoglyph_pw}", homoglyph_pw),
        _k(
            di,
            "unicode_escaped",
            "key: " + "".join(f"\\u{ord(c):04x}" for c in stripe),
            "".join(f"\\u{ord(c):04x}" for c in stripe[8:20]),
        ),
        _k(di, "html_escaped_json", html.escape(json.dumps({"token": json_escaped})), json_escaped),
        _k(
            di,
            "soft_hyphen",
            "ghp key " + "\u00ad".join(ghp[i : i + 6] for i in range(0, 40, 6)),
            "\u00ad".join(ghp[i : i + 6] for i in range(0, 18, 6)),
        ),
    ]


SEED = 20261129


def all_kinds(seed: int = SEED) -> list[Kind]:
    """The kinds, their random values drawn from ``seed`` (the same kinds on every call)."""
    _RNG.seed(seed)
    kinds = _held_out() + _tuning()
    # A kind without needles of its own holds its secret after the last "=" or quote.
    fixed = []
    for kind in kinds:
        if not kind.needles or kind.needles == ("",):
            secret = kind.text.rsplit('"', 2)[-2]
            kind = Kind(kind.family, kind.name, kind.text, (secret,), kind.held_out)
        fixed.append(kind)
    return fixed


POSITIONS = {
    "start": lambda s: f"{s} was pasted into the ticket by mistake.",
    "mid_sentence": lambda s: f"During the review we found {s} in the transcript and rotated it.",
    "json": lambda s: json.dumps({"ticket": "INC-4821", "body": s}),
    "log_line": lambda s: f"2026-11-29T10:15:00Z WARN worker[318]: request failed: {s} retrying",
    "code_block": lambda s: f"Run this:\n\n```\n{s}\n```\n\nthen restart.",
    "after_newline": lambda s: f"Notes from the call:\n{s}\nEnd of notes.",
    "markdown_table": lambda s: f"| field | value |\n| --- | --- |\n| leaked | {s} |",
}


def leaked_positions(scrub: object, kind: Kind) -> list[str]:
    """The positions from which ``kind`` leaks through ``scrub`` (a text -> text callable)."""
    plain = [_PlainKind(kind.name, kind.text, kind.needles)]
    leaked = []
    for position, plant in POSITIONS.items():
        out = scrub(plant(kind.text))  # type: ignore[operator]
        if leaked_kinds(out, plain) or _short_leak(out, kind):
            leaked.append(position)
    return leaked


def _short_leak(haystack: str, kind: Kind) -> bool:
    """A short identifier (fewer than 12 characters) leaks when any of its digit groups of 3 or
    more remains next to the others: a part redacted is not enough."""
    for needle in kind.needles:
        if len(needle) >= 12:
            continue
        compact = "".join(c for c in needle if c.isalnum())
        if compact in "".join(c for c in haystack if c.isalnum()):
            return True
    return False


def recall(scrub: object, seed: int = SEED) -> dict[str, object]:
    """Kinds caught per family, on the held-out kinds and on all of them."""
    kinds = all_kinds(seed)
    missed = {kind.name: leaked_positions(scrub, kind) for kind in kinds}
    report: dict[str, object] = {}
    for subset, chosen in (("held_out", [k for k in kinds if k.held_out]), ("all", kinds)):
        families: dict[str, list[int]] = {}
        for kind in chosen:
            counts = families.setdefault(kind.family, [0, 0])
            counts[1] += 1
            counts[0] += not missed[kind.name]
        caught = sum(c for c, _ in families.values())
        report[subset] = {"caught": caught, "kinds": len(chosen), "families": families}
    report["missed"] = {name: where for name, where in missed.items() if where}
    return report


def main() -> int:
    import recalltrace
    from recalltrace.tracer._scrub import Scrubber
    from tests.reliability.ordinary_corpus import SENTENCES

    scrubber = Scrubber(recalltrace.ScrubbingOptions())
    show_held_out = "--show-held-out" in sys.argv
    report = recall(lambda text: scrubber.scrub_text(text, "f", []))
    altered = [text for text in SENTENCES if scrubber.scrub_text(text, "f", []) != text]
    print(f"ordinary sentences altered: {len(altered)}/{len(SENTENCES)}")
    held = {k.name for k in all_kinds() if k.held_out}
    for subset in ("held_out", "all"):
        part = report[subset]
        assert isinstance(part, dict)
        print(f"{subset}: {part['caught']}/{part['kinds']} kinds caught")
        for family, (caught, total) in sorted(part["families"].items()):
            print(f"  {family}: {caught}/{total}")
    missed = report["missed"]
    assert isinstance(missed, dict)
    for name, where in missed.items():
        if name in held and not show_held_out:
            continue
        print(f"missed {name}: {', '.join(where)}")
    if "--seeds" in sys.argv:
        # The same kinds with their random values drawn again: how much recall depends on them.
        count = int(sys.argv[sys.argv.index("--seeds") + 1])
        for seed in range(SEED + 1, SEED + 1 + count):
            other = recall(lambda text: scrubber.scrub_text(text, "f", []), seed)
            parts = [other[subset] for subset in ("held_out", "all")]
            print(f"seed {seed}: " + ", ".join(f"{p['caught']}/{p['kinds']}" for p in parts))  # type: ignore[index]
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
