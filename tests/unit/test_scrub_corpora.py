"""Scrubbing measured on corpora: every kind of secret of the secrets corpus is caught in a
sentence, ordinary engineering text comes through unchanged, and the rule-file machinery
(gitleaks' schema, user files, Go expressions) behaves."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

import recalltrace
from recalltrace.storage.records import ContextRecord, TraceRecord
from recalltrace.tracer._scrub import Scrubber
from recalltrace.tracer._scrub._patterns import normalise
from recalltrace.tracer._scrub._ruleset import RuleFileSet, go_to_python
from tests.reliability.ordinary_corpus import SENTENCES
from tests.reliability.secret_kinds import Kind, all_kinds, leaked_kinds

KINDS = all_kinds()
R = "[REDACTED]"


def scrub(text: str, options: recalltrace.ScrubbingOptions | None = None) -> str:
    return Scrubber(options or recalltrace.ScrubbingOptions()).scrub_text(text, "f", [])


def test_the_corpora_are_large_enough() -> None:
    assert len({kind.name for kind in KINDS}) == len(KINDS) >= 150
    assert len(set(SENTENCES)) == len(SENTENCES) >= 200


@pytest.mark.parametrize("kind", KINDS, ids=[kind.name for kind in KINDS])
def test_every_kind_is_caught_in_a_sentence(kind: Kind) -> None:
    text = f"From the runbook: {kind.text} (rotate it quarterly)."
    scrubbed = scrub(text)
    assert leaked_kinds(scrubbed, [kind]) == [], scrubbed
    assert scrubbed.startswith("From the runbook: ")


def test_ordinary_text_is_left_alone() -> None:
    altered = [text for text in SENTENCES if scrub(text) != text]
    assert len(altered) <= len(SENTENCES) // 100, altered


def test_folded_forms_are_redacted_in_the_original_text() -> None:
    """Full-width and Arabic-Indic digits are matched in their folded (NFKC, ASCII digit) form
    and the redaction falls on the original characters, the text around them unchanged."""
    full_width = "カード ４１１１ １１１１ １１１１ １１１１ です"
    assert scrub(full_width) == f"カード {R} です"
    arabic = "البطاقة ٤١١١١١١١١١١١١١١١ شكرا"
    assert scrub(arabic) == f"البطاقة {R} شكرا"
    # A ligature folds to two characters: offsets after it still land on the original.
    assert scrub("ﬁle: mail jane@example.org now") == f"ﬁle: mail {R} now"
    assert normalise("plain ascii") == ("plain ascii", None)


def test_password_phrases_need_a_password_shaped_value() -> None:
    assert scrub("the password is Tr0ub4dor&3") == f"the password is {R}"
    assert scrub("Das Passwort lautet Sommer2024!") == f"Das Passwort lautet {R}!"
    # A plain word after "is" or ":" is prose; after "=" it is a value.
    for text in ("The password is stored in Vault.", "password: open Settings"):
        assert scrub(text) == text
    assert scrub("password=hunter") == f"password={R}"


def test_code_and_placeholders_are_not_secrets() -> None:
    for text in (
        "api_key=os.environ['OPENAI_API_KEY']",
        "API_KEY=${OPENAI_API_KEY}",
        "auth_token: ${{ secrets.DEPLOY_TOKEN }}",
        "MAX_TOKENS=4096",
        "password = getpass.getpass()",
        "git clone git@github.com:acme/repo.git",
        "logo@2x.png",
        "ssh deploy@bastion.example.com -p 2222",
    ):
        assert scrub(text) == text


def test_a_key_split_across_lines_is_redacted_whole() -> None:
    key = "ghp_" + "Ab3dE5gH7jK9mN1pQ3sT5vW7yZ9bC1dE3f"
    text = f"token {key[:30]}\n{key[30:]}x1 and more"
    assert scrub(text) == f"token {R} and more"


def test_base64_is_redacted_when_it_decodes_to_a_secret() -> None:
    import base64

    secret = base64.b64encode(b"DB_PASSWORD=Zq8-lmT3!x9\nDEBUG=1\n").decode()
    assert scrub(f"env: {secret}") == f"env: {R}"
    harmless = base64.b64encode(b"just a harmless configuration note, nothing more").decode()
    assert scrub(f"env: {harmless}") == f"env: {harmless}"


def test_user_rule_files_add_rules(tmp_path: Path) -> None:
    rules = tmp_path / "acme.toml"
    rules.write_text(
        "[[rules]]\n"
        'id = "acme-internal-token"\n'
        "regex = '''\\bacme_[a-z0-9]{24}\\b'''\n"
        'keywords = ["acme_"]\n',
        encoding="utf-8",
    )
    token = "acme_" + "k3j5h7g9f1d3s5a7q9w1e3r5"
    options = recalltrace.ScrubbingOptions(rule_files=[str(rules)])
    notes: list[str] = []
    assert Scrubber(options).scrub_text(f"use {token} now", "f", notes) == f"use {R} now"
    assert notes == ["scrubbed acme_internal_token in f"]
    assert scrub(f"use {token} now") == f"use {token} now"  # not a built-in kind


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[[rules]]\nid = 'x'\nregex = '''(unclosed'''\nkeywords = ['x']\n", "does not compile"),
        ("[[rules]]\nid = 'x'\nregex = '''abc'''\n", "has no keywords"),
        ("[[rules]\n", "cannot be read"),
    ],
)
def test_a_bad_rule_file_is_one_line_naming_it(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError) as raised:
        RuleFileSet([path])
    assert message in str(raised.value) and str(path) in str(raised.value)
    assert "\n" not in str(raised.value)


def test_go_expressions_are_read_as_python() -> None:
    assert go_to_python(r"\b(p8e-(?i)[a-z0-9]{32})(?:x|\z)") == r"\b(p8e-(?i:[a-z0-9]{32}))(?:x|\Z)"
    assert go_to_python(r"dp\.pt\.(?i)[a-z0-9]{43}") == r"dp\.pt\.(?i:[a-z0-9]{43})"
    assert go_to_python(r"[(?i)]x") == r"[(?i)]x"  # inside a class it is characters


def _record(**fields: Any) -> TraceRecord:
    base: dict[str, Any] = {
        "trace_id": "1" * 32,
        "app_name": "app",
        "service_name": "svc",
        "started_at": datetime.now(timezone.utc),
        "duration_ms": 1.0,
    }
    base.update(fields)
    return TraceRecord(**base)


def test_names_and_notes_of_every_record_are_scrubbed() -> None:
    """The app name (a collector takes it from a span name) and the service name (from the
    resource) are scrubbed, on every record even though each distinct name is searched once;
    a note never carries what was redacted."""
    token = "ghp_" + "Ab3dE5gH7jK9mN1pQ3sT5vW7yZ9bC1dE3fG5h"
    scrubber = Scrubber(recalltrace.ScrubbingOptions())
    for _ in range(2):
        record = _record(
            app_name=f"answer {token}",
            service_name=f"svc {token}",
            notes=[f"1 retrieved document(s) could not be read ({token})"],
        )
        scrubber.scrub_record(record)
        assert record.app_name == f"answer {R}" and record.service_name == f"svc {R}"
        assert token not in repr(record)
        assert "scrubbed api_key in app_name" in record.notes
        assert "scrubbed api_key in service_name" in record.notes


def test_a_document_string_seen_clean_does_not_hide_a_later_secret() -> None:
    scrubber = Scrubber(recalltrace.ScrubbingOptions())
    clean = _record(retrieved_contexts=[ContextRecord("text", id="kb/faq.md")])
    scrubber.scrub_record(clean)
    assert clean.retrieved_contexts[0].id == "kb/faq.md"
    token = "sk-proj-" + "Z9y8X7w6V5u4T3s2R1q0P9o8N7m6L5k4"
    leaking = _record(
        retrieved_contexts=[
            ContextRecord("text", id="kb/faq.md"),
            ContextRecord("text", id=f"kb/{token}", metadata={"source": f"s3://{token}"}),
        ]
    )
    scrubber.scrub_record(leaking)
    assert token not in repr(leaking)
    assert leaking.retrieved_contexts[0].id == "kb/faq.md"
