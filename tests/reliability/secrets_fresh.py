"""A second held-out corpus, written after the generic detectors were last tuned and measured
once before any change was made for it (``python -m tests.reliability.secrets_fresh``).

The first held-out set (``secrets_heldout``) stopped being held out when its misses were fixed;
this one takes its place: the figure reported in ``benchmarks/README.md`` is this corpus's, as
first measured. Kinds are planted in the same positions as there. Nothing here is a real secret:
every value is generated or a published example."""

from __future__ import annotations

import base64
import random
import string
import sys
import urllib.parse

from stdnum.br import cpf
from stdnum.es import dni
from stdnum.pl import pesel

from tests.reliability.secrets_heldout import Kind, leaked_positions

_RNG = random.Random(29112026)
_ALNUM = string.ascii_letters + string.digits


def _c(count: int, alphabet: str = _ALNUM) -> str:
    return "".join(_RNG.choice(alphabet) for _ in range(count))


def _password() -> str:
    return _c(4, string.ascii_letters) + _c(1, "#!%*@") + _c(3, string.digits) + _c(4)


def _k(family: str, name: str, text: str, *needles: str) -> Kind:
    return Kind(family, name, text, needles, True)


def kinds() -> list[Kind]:
    """The corpus: configuration syntaxes, command lines, connection strings, headers,
    personal identifiers and disguised forms."""
    cf, cl, cs, au, pi, di = "config", "command line", "connection", "auth", "personal", "disguised"
    pws = [_password() for _ in range(16)]
    hex32 = _c(32, "0123456789abcdef")
    cpf_number = "529982247" + cpf._calc_check_digits("529982247")
    dni_number = "12345678" + dni.calc_check_digit("12345678")
    pesel_base = "4405140135"
    pesel_number = pesel_base + pesel.calc_check_digit(pesel_base)
    return [
        _k(cf, "spring_properties", f"spring.datasource.password={pws[0]}", pws[0]),
        _k(cf, "yaml_nested", f'db:\n  credentials:\n    pass: "{pws[1]}"', pws[1]),
        _k(cf, "ansible_become", f'ansible_become_pass: "{pws[2]}"', pws[2]),
        _k(cf, "dotenv_quoted", f"SMTP_PASSWORD='{pws[3]}'", pws[3]),
        _k(cf, "php_array", f"'db_password' => '{pws[4]}',", pws[4]),
        _k(cl, "docker_login", f"docker login -u ci -p '{pws[5]}' registry.internal", pws[5]),
        _k(cl, "export_pgpassword", f"export PGPASSWORD='{pws[6]}'", pws[6]),
        _k(
            cl,
            "kubectl_literal",
            f"kubectl create secret generic db --from-literal=password={pws[7]}",
            pws[7],
        ),
        _k(cl, "net_use", f"net use Z: \\\\files\\share /user:CORP\\svc {pws[8]}", pws[8]),
        _k(
            cs,
            "odbc_string",
            f"Server=tcp:sql.internal,1433;Database=app;User ID=svc;Password={pws[9]};",
            pws[9],
        ),
        _k(cs, "jdbc_query", f"jdbc:mysql://db:3306/app?user=svc&password={pws[10]}", pws[10]),
        _k(cs, "redis_url", f"rediss://:{pws[11]}@cache.internal:6380/0", pws[11]),
        _k(au, "x_auth_token", f"X-Auth-Token: {hex32}", hex32),
        _k(
            au,
            "proxy_authorization",
            "Proxy-Authorization: Basic " + base64.b64encode(f"proxy:{pws[12]}".encode()).decode(),
            base64.b64encode(f"proxy:{pws[12]}".encode()).decode(),
        ),
        _k(au, "query_api_key", f"GET /v1/search?q=rag&api_key={_c(32)}", ""),
        _k(pi, "br_cpf_plain", f"CPF {cpf_number}", cpf_number),
        _k(pi, "es_dni", f"DNI {dni_number}", dni_number),
        _k(pi, "pl_pesel", f"PESEL: {pesel_number}", pesel_number),
        _k(pi, "uk_nino", "National Insurance number AB 12 34 56 C", "AB 12 34 56 C"),
        _k(pi, "uk_phone", "call me on +44 20 7946 0958 after six", "+44 20 7946 0958"),
        _k(
            di,
            "password_url_encoded",
            "next=" + urllib.parse.quote(f"login?user=ops&password={pws[13]}", safe=""),
            urllib.parse.quote(pws[13], safe=""),
        ),
        _k(
            di,
            "password_base64_json",
            base64.b64encode(f'{{"user": "ops", "password": "{pws[14]}"}}'.encode()).decode(),
            "",
        ),
        _k(di, "password_in_markdown_code", f"the password is `{pws[15]}`", pws[15]),
    ]


def _needles_fixed(chosen: list[Kind]) -> list[Kind]:
    """Kinds whose needle is the whole text (an encoded blob, a query's key) get it filled."""
    fixed = []
    for kind in chosen:
        if kind.needles == ("",):
            secret = kind.text.rsplit("=", 1)[-1] if "api_key=" in kind.text else kind.text
            kind = Kind(kind.family, kind.name, kind.text, (secret,), True)
        fixed.append(kind)
    return fixed


def recall(scrub: object) -> dict[str, object]:
    """Kinds caught (leaking from no position) per family, and where each miss leaks."""
    chosen = _needles_fixed(kinds())
    missed = {kind.name: leaked_positions(scrub, kind) for kind in chosen}
    families: dict[str, list[int]] = {}
    for kind in chosen:
        counts = families.setdefault(kind.family, [0, 0])
        counts[1] += 1
        counts[0] += not missed[kind.name]
    return {
        "caught": sum(c for c, _ in families.values()),
        "kinds": len(chosen),
        "families": families,
        "missed": {name: where for name, where in missed.items() if where},
    }


def main() -> int:
    import recalltrace
    from recalltrace.tracer._scrub import Scrubber

    scrubber = Scrubber(recalltrace.ScrubbingOptions())
    report = recall(lambda text: scrubber.scrub_text(text, "f", []))
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
