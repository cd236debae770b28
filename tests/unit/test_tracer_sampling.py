"""Head sampling: deterministic per trace id, nested across rates, per-app rates."""

from __future__ import annotations

import random
import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st

import recalltrace
from recalltrace.tracer._sampling import TraceSampler, is_sampled, rate_threshold
from tests.support.tracer_helpers import make_traced

_RANDOM = random.Random(7)
IDS = [_RANDOM.getrandbits(128) for _ in range(20_000)]


def _sampled(rate: float, ids: list[int] = IDS) -> set[int]:
    threshold = rate_threshold(rate)
    return {trace_id for trace_id in ids if is_sampled(trace_id, threshold)}


def test_rates_select_nested_sets_of_about_the_right_size() -> None:
    previous: set[int] = set()
    for rate in (0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 0.9, 1.0):
        chosen = _sampled(rate)
        assert previous <= chosen, f"raising the rate to {rate} dropped traces"
        assert abs(len(chosen) / len(IDS) - rate) < 0.015
        previous = chosen
    assert _sampled(0.0) == set() and _sampled(1.0) == set(IDS)


@given(st.integers(min_value=1, max_value=(1 << 128) - 1), st.floats(0, 1), st.floats(0, 1))
def test_monotone_in_the_rate_for_any_id(trace_id: int, a: float, b: float) -> None:
    low, high = sorted((a, b))
    if is_sampled(trace_id, rate_threshold(low)):
        assert is_sampled(trace_id, rate_threshold(high))


def test_same_decision_in_another_process() -> None:
    ids = IDS[:200]
    code = (
        "import sys\n"
        "from recalltrace.tracer._sampling import TraceSampler\n"
        "s = TraceSampler(0.3, {'other': 0.8})\n"
        "ids = [int(x) for x in sys.stdin.read().split()]\n"
        "print(''.join('1' if s.should_sample(i, 'app') else '0' for i in ids))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        input=" ".join(map(str, ids)),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    here = TraceSampler(0.3, {"other": 0.8})
    assert out == "".join("1" if here.should_sample(i, "app") else "0" for i in ids)


def test_per_app_rates_override_the_default() -> None:
    sampler = TraceSampler(0.0, {"support-bot": 1.0, "search": 0.5})
    assert all(sampler.should_sample(i, "support-bot") for i in IDS[:100])
    assert not any(sampler.should_sample(i, "other-app") for i in IDS[:100])
    half = sum(sampler.should_sample(i, "search") for i in IDS)
    assert abs(half / len(IDS) - 0.5) < 0.02
    assert sampler.could_be_sampled(IDS[0])
    assert TraceSampler(0.0).never


def test_sampling_decides_once_per_trace_and_counts() -> None:
    state = make_traced(sample_rate=0.5)
    try:

        @recalltrace.retrieval
        def search(query: str) -> list[str]:
            return ["doc"]

        @recalltrace.rag
        def answer(question: str) -> str:
            search(question)
            search(question)
            return "ok"

        for i in range(200):
            answer(f"q{i}")
        records = state.records()
        stored = {r.trace_id for r in records}
        roots = state.spans("answer")
        threshold = rate_threshold(0.5)
        # Decided per request from the record's own id: every stored id is one the rate keeps.
        assert all(is_sampled(int(tid, 16), threshold) for tid in stored)
        assert {r.otel_trace_id for r in records} <= {
            format(span.context.trace_id, "032x") for span in roots
        }
        assert 60 < len(stored) < 140
        # Every stored trace has both retrievals: the decision held for the whole trace.
        assert all(len(r.retrieved_contexts) == 2 for r in records)
        # Unsampled traces still produce spans for the application's exporters.
        assert len(roots) == 200 and len(state.spans("search")) == 400
        captured = dict(
            (tuple(a.items()), v) for a, v in state.metric_points("rag.traces.captured")
        )
        sampled = dict((tuple(a.items()), v) for a, v in state.metric_points("rag.traces.sampled"))
        assert captured[(("rag.app", "answer"),)] >= 200
        assert sampled[(("rag.app", "answer"),)] >= len(stored)
    finally:
        recalltrace.shutdown(1)


def test_per_app_rate_through_configure() -> None:
    state = make_traced(sample_rate=0.0, sample_rates={"kept": 1.0})

    @recalltrace.rag("kept")
    def kept(question: str) -> str:
        return "a"

    @recalltrace.rag("ignored")
    def ignored(question: str) -> str:
        return "b"

    try:
        for i in range(5):
            kept(str(i))
            ignored(str(i))
        assert {r.app_name for r in state.records()} == {"kept"}
        assert len(state.records()) == 5
    finally:
        recalltrace.shutdown(1)
