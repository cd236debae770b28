"""Scrubbing before anything is stored: default patterns, user patterns, callback, notes."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest

import recalltrace
from recalltrace.storage.records import ContextRecord, TraceRecord
from recalltrace.tracer._scrub import Scrubber, default_pattern_names
from tests.support.tracer_helpers import Traced, make_traced, traced_session


@pytest.fixture
def traced() -> Iterator[Traced]:
    yield from traced_session()


R = "[REDACTED]"


def scrub(text: str, options: recalltrace.ScrubbingOptions | None = None) -> tuple[str, list[str]]:
    notes: list[str] = []
    return Scrubber(options or recalltrace.ScrubbingOptions()).scrub_text(text, "f", notes), notes


@pytest.mark.parametrize(
    ("text", "expected", "pattern"),
    [
        ("key sk-proj-abcdefghijklmnop1234 here", f"key {R} here", "api_key"),
        ("aws AKIAIOSFODNN7EXAMPLE!", f"aws {R}!", "api_key"),
        ("gh ghp_" + "a" * 36, f"gh {R}", "api_key"),
        ("slack xoxb-1234567890-abcdef", f"slack {R}", "api_key"),
        ("token hf_" + "x" * 34 + " end", f"token {R} end", "api_key"),
        ("pat github_pat_" + "Ab1_" * 10, f"pat {R}", "api_key"),
        ("google AIza" + "B" * 35, f"google {R}", "api_key"),
        ('{"api_key": "abc123def456"}', f'{{"api_key": "{R}"}}', "api_key"),
        ("Authorization: Bearer abc.def-ghi_jkl", f"Authorization: Bearer {R}", "bearer_token"),
        ("jwt eyJhbGciOiJIUzI1.eyJzdWIiOiIxMjM0.SflKxwRJSMeKKF2QT4", f"jwt {R}", "bearer_token"),
        ("login with password=hunter2; ok", f"login with password={R}; ok", "password"),
        ("PASSWORD: 's3cr3t!'", f"PASSWORD: '{R}'", "password"),
        ("mail jane.doe+rag@example.co.uk now", f"mail {R} now", "email"),
        ("card 4111 1111 1111 1111 exp", f"card {R} exp", "card_number"),
        ("card 5500-0000-0000-0004.", f"card {R}.", "card_number"),
        ("gitlab glpat-" + "x1Y2" * 5 + " end", f"gitlab {R} end", "gitlab_token"),
        ("runner GR1348941" + "aB3" * 7, f"runner {R}", "gitlab_token"),
        (
            "post to https://hooks.slack.com/services/T0ABC/B0DEF/" + "q" * 24 + " now",
            f"post to {R} now",
            "webhook_url",
        ),
        (
            "https://discord.com/api/webhooks/1234567890/" + "Zz9_" * 8,
            R,
            "webhook_url",
        ),
        ("AccountKey=" + "Ab1+" * 21 + "==;Suffix", f"AccountKey={R};Suffix", "azure_key"),
        (
            "?sv=2022-11-02&sig=AbC%2Bdef0123456789xyz%3D&se=1",
            f"?sv=2022-11-02&sig={R}&se=1",
            "azure_sas",
        ),
        (
            "aws_secret wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            f"aws_secret {R}",
            "aws_secret_key",
        ),
        ("postgres://bob:s3cr3t@db:5432/app", f"postgres://bob:{R}@db:5432/app", "url_password"),
        ("Authorization: Basic dXNlcjpwYXNz", f"Authorization: Basic {R}", "authorization"),
        ("DB_PASSWORD=hunter22", f"DB_PASSWORD={R}", "password"),
        ("SLACK_BOT_TOKEN=abc123xyz", f"SLACK_BOT_TOKEN={R}", "env_secret"),
        ("twilio SK" + "0a" * 16, f"twilio {R}", "api_key"),
        ("SG." + "a" * 22 + "." + "b" * 43, R, "api_key"),
        ("npm npm_" + "A1" * 18, f"npm {R}", "api_key"),
        ("mailgun key-" + "f0" * 16, f"mailgun {R}", "api_key"),
        ("shopify shpat_" + "ab12" * 8, f"shopify {R}", "api_key"),
        ("IBAN GB82 WEST 1234 5698 7654 32 paid", f"IBAN {R} paid", "iban"),
        ("SSN 123-45-6789.", f"SSN {R}.", "ssn"),
        ("call +44 20 7946 0958 today", f"call {R} today", "phone_number"),
        ("call (415) 555-2671 today", f"call {R} today", "phone_number"),
    ],
)
def test_default_patterns(text: str, expected: str, pattern: str) -> None:
    scrubbed, notes = scrub(text)
    assert scrubbed == expected
    assert notes == [f"scrubbed {pattern} in f"]


@pytest.mark.parametrize(
    "text",
    [
        "The capital of France is Paris.",
        "Order 1234 5678 9012 3456 is not a valid card (Luhn fails).",
        "Call 555-0100 between 9 and 17.",
        "The key insight: recall matters.",
        "Use token-based retrieval with a bearer of good news.",
        "Reading the password policy page is fine.",
        "See docs/high_level_design.md and the gh_pages branch.",
        "Release 2.4.1 (2026-11-24) fixes RFC 9110 parsing; build 20261124.3.",
        "sha1 da39a3ee5e6b4b0d3255bfef95601890afd80709, uuid 123e4567-e89b-12d3-a456-426614174000",
        "The Basic plan costs 10 USD; the token: a unit of text.",
        "Revenue was 1,234,567 EUR in FY2025, up 12.5% on 2024-2025.",
        "Global glossary: glance at the AWS region eu-west-1 docs.",
        "See https://example.com/docs?page=2&sort=asc for details.",
        "ISBN 978-3-16-148410-0 and DE12 is not an account.",
        "KEY POINTS: recall is the share of needed facts retrieved.",
    ],
)
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert scrub(text) == (text, [])


def test_user_patterns_and_callback() -> None:
    seen = []

    def callback(match: recalltrace.ScrubMatch) -> str | None:
        seen.append((match.path, match.value, match.pattern))
        if match.pattern == "email" and match.value.endswith("@example.com"):
            return match.value  # keep: public support address
        if match.pattern == "custom":
            return "<employee>"
        return None

    options = recalltrace.ScrubbingOptions(extra_patterns=[r"EMP-\d{6}"], callback=callback)
    text = "support@example.com, private@corp.io, emp-123456"
    scrubbed, notes = scrub(text, options)
    assert scrubbed == f"support@example.com, {R}, <employee>"
    assert ("f", "support@example.com", "email") in seen
    assert ("f", "emp-123456", "custom") in seen
    assert notes == ["scrubbed email in f", "scrubbed custom in f"]


def test_raising_callback_redacts(caplog: pytest.LogCaptureFixture) -> None:
    def callback(match: recalltrace.ScrubMatch) -> str | None:
        raise RuntimeError("callback bug")

    scrubbed, _ = scrub("a@b.example", recalltrace.ScrubbingOptions(callback=callback))
    assert scrubbed == R
    assert "scrubbing callback raised" in caplog.text


def test_defaults_can_be_switched_off_and_replacement_changed() -> None:
    assert scrub("x@y.example", recalltrace.ScrubbingOptions(default_patterns=False)) == (
        "x@y.example",
        [],
    )
    options = recalltrace.ScrubbingOptions(replacement="***")
    assert scrub("x@y.example", options)[0] == "***"
    names = set(default_pattern_names())
    assert {
        "bearer_token", "api_key", "password", "email", "card_number", "gitlab_token",
        "webhook_url", "azure_key", "azure_sas", "aws_secret_key", "url_password",
        "authorization", "env_secret", "iban", "ssn", "phone_number", "private_key",
        "encoded_secret", "cli_password",
    } <= names  # fmt: skip
    # The rule files' kinds (gitleaks' own and the scrubber's) are named by their ids.
    assert {"stripe_access_token", "databricks_api_token", "google_oauth_client_secret"} <= names
    assert len(names) > 200


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


def test_contents_found_clean_are_remembered_and_never_hide_a_secret() -> None:
    """Retrieved contents found clean are not gated again (the same documents come back
    request after request), and the memory never lets a secret through: a content is known
    clean only as the very text that was found clean."""
    scrubber = Scrubber(recalltrace.ScrubbingOptions())
    clean = "Refunds take 14 days from the day the parcel arrives."
    secret = "contact dave@example.org for refunds"
    first = _record(retrieved_contexts=[ContextRecord(clean, id="a")])
    scrubber.scrub_record(first)
    assert first.retrieved_contexts[0].content == clean
    assert clean in scrubber._clean_contents
    # Beside a remembered clean document, a new one holding a secret is scrubbed.
    second = _record(
        retrieved_contexts=[ContextRecord(clean, id="a"), ContextRecord(secret, id="b")]
    )
    scrubber.scrub_record(second)
    assert [c.content for c in second.retrieved_contexts] == [clean, f"contact {R} for refunds"]
    assert second.notes == ["scrubbed email in retrieved_contexts[1].content"]
    assert secret not in scrubber._clean_contents
    # The clean text with a secret appended is another text: scrubbed, not remembered.
    third = _record(retrieved_contexts=[ContextRecord(clean + " key sk-abcdefghijklmnopqrstu")])
    scrubber.scrub_record(third)
    assert third.retrieved_contexts[0].content == f"{clean} key {R}"
    # A secret seen twice is scrubbed twice.
    fourth = _record(retrieved_contexts=[ContextRecord(secret)])
    scrubber.scrub_record(fourth)
    assert fourth.retrieved_contexts[0].content == f"contact {R} for refunds"


def test_contents_are_gated_every_time_with_custom_patterns() -> None:
    options = recalltrace.ScrubbingOptions(extra_patterns=[r"TICKET-\d+"])
    scrubber = Scrubber(options)
    for _ in range(2):
        record = _record(retrieved_contexts=[ContextRecord("see TICKET-42 for the answer")])
        scrubber.scrub_record(record)
        assert record.retrieved_contexts[0].content == f"see {R} for the answer"
    assert not scrubber._clean_contents


def test_record_scrubbing_covers_every_field_and_notes_paths() -> None:
    record = _record(
        user_input="I am bob@example.org",
        response="Your key is sk-abcdefghijklmnopqrstu",
        reference="ok",
        reference_contexts=["call me at carol@example.org"],
        retrieved_contexts=[
            ContextRecord("clean", id="1", metadata={"source": "a.md", "api_key": "k-123"}),
            ContextRecord("dave@example.org wrote", id="2", metadata={"nested": {"token": 5}}),
        ],
        metadata={"user": {"email": "erin@example.org"}, "session_id": "abc"},
    )
    Scrubber(recalltrace.ScrubbingOptions()).scrub_record(record)
    assert record.user_input == f"I am {R}"
    assert record.response == f"Your key is {R}"
    assert record.reference_contexts == [f"call me at {R}"]
    assert record.retrieved_contexts[0].content == "clean"
    assert record.retrieved_contexts[0].metadata == {"source": "a.md", "api_key": R}
    assert record.retrieved_contexts[1].content == f"{R} wrote"
    assert record.retrieved_contexts[1].metadata == {"nested": {"token": R}}
    assert record.metadata == {"user": {"email": R}, "session_id": R}
    assert record.notes == [
        "scrubbed email in user_input",
        "scrubbed api_key in response",
        "scrubbed email in reference_contexts[0]",
        "scrubbed email in retrieved_contexts[1].content",
        "scrubbed sensitive_key in retrieved_contexts[0].metadata.api_key",
        "scrubbed sensitive_key in retrieved_contexts[1].metadata.nested.token",
        "scrubbed email in metadata.user.email",
        "scrubbed sensitive_key in metadata.session_id",
    ]


def test_sensitive_key_names() -> None:
    scrubber = Scrubber(recalltrace.ScrubbingOptions())
    for key in (
        "password",
        "API_KEY",
        "apiKey",
        "access_token",
        "Authorization",
        "cookie",
        "session",
        "credit_card",
        "ssn",
        "private-key",
        "client_secret",
    ):
        assert scrubber.is_sensitive_key(key), key
    for key in ("source", "author", "prompt_tokens", "tokenizer", "page", "title", "keywords"):
        assert not scrubber.is_sensitive_key(key), key


def test_stored_record_is_scrubbed_but_spans_are_not_by_default(traced: Traced) -> None:
    @recalltrace.retrieval
    def search(query: str) -> list[dict[str, Any]]:
        return [{"content": "contact ops@corp.example", "metadata": {"password": "pw"}}]

    @recalltrace.rag
    def answer(question: str) -> str:
        search(question)
        return "done"

    answer("my card is 4111111111111111")
    record = traced.record()
    assert record.user_input == f"my card is {R}"
    assert record.retrieved_contexts[0].content == f"contact {R}"
    assert record.retrieved_contexts[0].metadata == {"password": R}
    assert "scrubbed card_number in user_input" in record.notes
    assert traced.span("answer").attributes["input.value"] == "my card is 4111111111111111"


def test_span_scrubbing_option() -> None:
    state = make_traced(scrubbing=recalltrace.ScrubbingOptions(scrub_span_attributes=True))
    try:

        @recalltrace.retrieval
        def search(query: str) -> list[str]:
            return ["contact ops@corp.example"]

        search("who is bob@example.org")
        attributes = state.span("search").attributes
        assert attributes["input.value"] == f"who is {R}"
        assert attributes["retrieval.documents.0.document.content"] == f"contact {R}"
    finally:
        recalltrace.shutdown(1)


def test_scrubbing_off_stores_text_unchanged() -> None:
    state = make_traced(scrubbing=False)
    try:

        @recalltrace.rag
        def answer(question: str) -> str:
            return "ok"

        answer("mail bob@example.org")
        record = state.record()
        assert record.user_input == "mail bob@example.org" and record.notes == []
    finally:
        recalltrace.shutdown(1)


def test_long_text_is_truncated_and_noted() -> None:
    state = make_traced(max_text_length=10)
    try:

        @recalltrace.retrieval
        def search(query: str) -> list[str]:
            return ["x" * 25]

        @recalltrace.rag
        def answer(question: str) -> str:
            search(question)
            return "short"

        answer("q" * 12)
        record = state.record()
        assert record.user_input == "q" * 10
        assert record.retrieved_contexts[0].content == "x" * 10
        assert record.response == "short"
        assert record.notes == [
            "truncated retrieved_contexts[0] from 25 to 10 characters",
            "truncated user_input from 12 to 10 characters",
        ]
    finally:
        recalltrace.shutdown(1)


def test_raising_callback_in_the_pipeline_still_stores_a_redacted_record() -> None:
    def callback(match: recalltrace.ScrubMatch) -> str | None:
        raise RuntimeError("callback bug")

    state = make_traced(scrubbing=recalltrace.ScrubbingOptions(callback=callback))
    try:

        @recalltrace.rag
        def answer(question: str) -> str:
            return "ok"

        assert answer("mail bob@example.org") == "ok"
        record = state.record()
        assert record.user_input == f"mail {R}"
        assert record.notes == ["scrubbed email in user_input"]
    finally:
        recalltrace.shutdown(1)


def test_secrets_in_ids_reference_ids_and_metadata_keys_are_scrubbed() -> None:
    """They used to be stored verbatim (54 of 54 in a corpus of realistic secrets), and a
    secret metadata key was copied into the record's notes."""
    from tests.support.tracer_helpers import make_traced

    github = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
    openai_key = "sk-proj-" + "Z9y8X7w6V5u4T3s2R1q0P9o8N7m6L5k4"
    traced = make_traced()

    @recalltrace.retrieval
    def search(query: str) -> list[dict[str, object]]:
        return [{"id": f"doc-{github}", "content": "text", "metadata": {openai_key: "v"}}]

    @recalltrace.rag(reference_context_ids_param="gold")
    def answer(question: str, gold: list[str]) -> str:
        search(question)
        return "ok"

    try:
        answer("q", gold=[f"ref-{github}"])
        record = traced.record()
        stored = repr(record)
        assert github not in stored and openai_key not in stored
        assert record.retrieved_contexts[0].id is not None
        assert record.reference_context_ids is not None
        assert "[REDACTED]" in record.retrieved_contexts[0].id
        assert "[REDACTED]" in record.reference_context_ids[0]
    finally:
        recalltrace.shutdown(2)
