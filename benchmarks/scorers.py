"""Benchmark the scorers against Ragas and against the throughput bound.

Run from the repository root:

    python -m benchmarks.scorers [--samples 1000] [--traces 4000] [--processes 4] [--repeats 3]

1. non_llm_context_recall on samples of 10 retrieved x 5 reference contexts of 300 characters,
   against Ragas' NonLLMContextRecall on the same samples (scores must be identical).
2. Prompt tokens of llm_context_recall (tiktoken cl100k_base, counted on the request bodies
   that reach a local server) against Ragas' legacy and collections prompts, captured the same
   way by running Ragas' own metrics against that server. Also the reference-claims cache.
3. Throughput of the LLM variants through LiteLLM against the scripted judge server run as a
   separate process with a fixed latency, at concurrency 64, set up as ``recalltrace worker``
   sets up its process (``load_judge_backend(freeze_gc=True, litellm_http=True)``), in one
   process and split over several (``--processes``, 4 by default); bare LiteLLM calls on both
   of its routes to an OpenAI-compatible server for comparison. The rate is the steady one,
   between the 10% and the 90% mark of a run, with the whole run's beside it. The split runs
   are repeated in rounds (``--repeats``, 3 by default) and each variant's figure is the median
   of its rounds, since the machine's speed drifts between minutes.

Ragas is optional (the ``bench`` extra: ragas==0.4.3 with langchain-community<0.4); without it
the Ragas columns say so and our own figures are still printed.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import json
import os
import random
import statistics
import string
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("RAGAS_DO_NOT_TRACK", "true")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from benchmarks._cpu import process_cpu_s
from recalltrace import scorers
from recalltrace.scorers._judge import LITELLM_HTTP_FLAG
from tests.support import ROOT
from tests.support.judge_server import JudgeServer, Reply, auto_answer

LATENCY_S = 0.2
# A model in LiteLLM's price list, served by the local judge: a real deployment's cost path.
JUDGE_MODEL = "openai/gpt-4o-mini"
CONCURRENCY = 64


# --- data -------------------------------------------------------------------------------------


def corpus() -> str:
    """Real English prose: the docstrings of a few standard-library modules."""
    parts = []
    for name in (
        "argparse",
        "asyncio.events",
        "collections",
        "json",
        "logging",
        "subprocess",
        "typing",
        "email.message",
        "http.client",
        "unittest.case",
    ):
        module = importlib.import_module(name)
        for obj in vars(module).values():
            doc = inspect.getdoc(obj)
            if doc and len(doc) > 200:
                parts.append(" ".join(doc.split()))
    return " ".join(parts)


def make_samples(count: int, seed: int = 7) -> list[tuple[list[str], list[str]]]:
    """10 retrieved x 5 reference contexts of 300 characters; half the references are edited
    copies of a retrieved context (5-60% of characters changed), half are unrelated text."""
    rnd = random.Random(seed)
    text = corpus()

    def window() -> str:
        start = rnd.randrange(0, len(text) - 300)
        return text[start : start + 300]

    def edit(s: str, rate: float) -> str:
        return "".join(
            rnd.choice(string.ascii_lowercase + " ") if rnd.random() < rate else c for c in s
        )

    samples = []
    for _ in range(count):
        retrieved = [window() for _ in range(10)]
        reference = [
            edit(rnd.choice(retrieved), rnd.choice([0.05, 0.2, 0.4, 0.6]))
            if rnd.random() < 0.5
            else window()
            for _ in range(5)
        ]
        samples.append((retrieved, reference))
    return samples


def ragas_available() -> str | None:
    """None when Ragas imports, else why not."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import ragas  # noqa: F401
            from ragas.metrics import NonLLMContextRecall  # noqa: F401
    except Exception as exc:  # any import failure means "cannot compare"
        return f"{type(exc).__name__}: {exc}"
    return None


# --- 1. non-LLM speed -------------------------------------------------------------------------


def bench_non_llm(
    count: int, ragas_problem: str | None, blocks: int = 4, repeats: int = 3
) -> dict[str, Any]:
    """Ours and Ragas alternate over blocks of the samples, so load from other processes on
    the shared machine weighs on both sides alike; wall and CPU time are both reported."""
    samples = make_samples(count)
    scorer = scorers.get("non_llm_context_recall")

    def run_ours(block: list[tuple[list[str], list[str]]]) -> tuple[list[Any], float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        values = [
            scorer.score(retrieved_contexts=ret, reference_contexts=ref).value for ret, ref in block
        ]
        return values, time.perf_counter() - wall, time.process_time() - cpu

    run_ours(samples[:50])  # warm-up (first NumPy and RapidFuzz calls)
    print(f"non_llm_context_recall: {count} samples of 10 retrieved x 5 reference x 300 chars")
    out: dict[str, Any] = {"samples": count}
    if ragas_problem:
        _, wall, cpu = run_ours(samples)
        out.update(ours_ms=wall * 1000 / count, ours_cpu_ms=cpu * 1000 / count)
        print(f"  recalltrace  {out['ours_ms']:.4f} ms/sample wall, {out['ours_cpu_ms']:.4f} CPU")
        print(f"  Ragas        not run: {ragas_problem}")
        return out
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from ragas.dataset_schema import SingleTurnSample
        from ragas.metrics import NonLLMContextRecall

    metric = NonLLMContextRecall()

    async def ragas_block(block: list[tuple[list[str], list[str]]]) -> list[float]:
        return [
            await metric.single_turn_ascore(
                SingleTurnSample(retrieved_contexts=ret, reference_contexts=ref)
            )
            for ret, ref in block
        ]

    def run_ragas(block: list[tuple[list[str], list[str]]]) -> tuple[list[Any], float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        values = asyncio.run(ragas_block(block))
        return values, time.perf_counter() - wall, time.process_time() - cpu

    asyncio.run(ragas_block(samples[:20]))  # warm-up
    ours: list[Any] = []
    theirs: list[Any] = []
    totals = {"ours_wall": 0.0, "ours_cpu": 0.0, "ragas_wall": 0.0, "ragas_cpu": 0.0}
    means = {"ours_wall": 0.0, "ragas_wall": 0.0}
    size = -(-count // blocks)
    for start in range(0, count, size):
        block = samples[start : start + size]
        # The sides alternate `repeats` times over each block; each side's fastest run counts
        # (the least disturbed by the rest of the machine), the mean is printed beside it.
        runs: dict[str, list[tuple[float, float]]] = {"ours": [], "ragas": []}
        for _ in range(repeats):
            mine, wall, cpu = run_ours(block)
            runs["ours"].append((wall, cpu))
            other, wall, cpu = run_ragas(block)
            runs["ragas"].append((wall, cpu))
        ours += mine
        theirs += other
        for side, timings in runs.items():
            totals[f"{side}_wall"] += min(wall for wall, _ in timings)
            totals[f"{side}_cpu"] += min(cpu for _, cpu in timings)
            means[f"{side}_wall"] += statistics.fmean(wall for wall, _ in timings)
    identical = sum(a == b for a, b in zip(ours, theirs, strict=True))
    out.update(
        {key: value * 1000 / count for key, value in totals.items()},
        identical=identical,
        ratio_wall=totals["ragas_wall"] / totals["ours_wall"],
        ratio_cpu=totals["ragas_cpu"] / totals["ours_cpu"],
        ratio_mean_wall=means["ragas_wall"] / means["ours_wall"],
    )
    print(
        f"  recalltrace  {out['ours_wall']:.4f} ms/sample wall  {out['ours_cpu']:.4f} ms CPU"
        f"   mean score {statistics.fmean(ours):.4f}"
    )
    print(f"  Ragas 0.4.3  {out['ragas_wall']:.4f} ms/sample wall  {out['ragas_cpu']:.4f} ms CPU")
    print(f"  identical scores: {identical}/{count}")
    print(
        f"  speed-up: {out['ratio_wall']:.1f}x wall, {out['ratio_cpu']:.1f}x CPU, best of "
        f"{repeats} per block (target >= 20x); {out['ratio_mean_wall']:.1f}x on mean wall times"
    )
    if identical != count:
        raise SystemExit("scores differ from Ragas: the benchmark fails")
    return out


# --- 2. prompt tokens -------------------------------------------------------------------------

DOC_CASE = {
    "user_input": "Where is the Eiffel Tower located?",
    "retrieved_contexts": ["Paris is the capital of France."],
    "reference": "The Eiffel Tower is located in Paris.",
}


def large_case() -> dict[str, Any]:
    rnd = random.Random(11)
    text = corpus()
    contexts = []
    for _ in range(10):
        start = rnd.randrange(0, len(text) - 300)
        contexts.append(text[start : start + 300])
    reference = (
        "The json module encodes Python objects as JSON text and decodes JSON text back. "
        "The dumps function returns a string, while dump writes to a file-like object. "
        "Keys in JSON objects are always strings, so other key types are converted. "
        "The indent parameter pretty-prints nested arrays and objects. "
        "Decoding errors raise JSONDecodeError, a subclass of ValueError."
    )
    return {
        "user_input": "How does Python's json module serialise data?",
        "retrieved_contexts": contexts,
        "reference": reference,
    }


def dense_case() -> dict[str, Any]:
    """The same sizes in made-up words of random letters: about two characters a token, which
    reproduces the Ragas figures of the specification (about 2,600 legacy prompt tokens)."""
    rnd = random.Random(3)

    def words(size: int = 300) -> str:
        text = ""
        while len(text) < size:
            text += "".join(rnd.choices(string.ascii_lowercase, k=rnd.randint(2, 9))) + " "
        return text[:size]

    return {
        "user_input": "What does the text say?",
        "retrieved_contexts": [words() for _ in range(10)],
        "reference": " ".join(words()[:80].strip() + "." for _ in range(5)),
    }


def token_counter() -> Any:
    # tiktoken fetches its tables from the internet unless told where a copy is; LiteLLM ships
    # cl100k_base, so point tiktoken there when the user has not chosen a cache.
    import litellm

    bundled = Path(litellm.__file__).parent / "litellm_core_utils" / "tokenizers"
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(bundled))
    import tiktoken

    return tiktoken.get_encoding("cl100k_base")


def chat_tokens(encoding: Any, body: dict[str, Any]) -> int:
    """Prompt tokens of a chat request as OpenAI counts them: content plus 3 per message + 3."""
    total = 3
    for message in body["messages"]:
        total += 3 + len(encoding.encode(str(message.get("content", ""))))
    return total


def schema_tokens(encoding: Any, body: dict[str, Any]) -> int:
    """Tokens of a JSON schema sent beside the messages (structured output or tools)."""
    extra = {k: body[k] for k in ("response_format", "tools", "functions") if k in body}
    fmt = extra.get("response_format")
    if fmt == {"type": "json_object"}:
        extra.pop("response_format")
    return len(encoding.encode(json.dumps(extra))) if extra else 0


def ragas_requests(case: dict[str, Any]) -> dict[str, dict[str, Any] | str]:
    """The first request body each Ragas API sends for ``case``, captured on a local server."""

    def answer(request: dict[str, Any]) -> Reply:
        return Reply.json({"classifications": [{"statement": "s", "reason": "r", "attributed": 1}]})

    captured: dict[str, dict[str, Any] | str] = {}
    with warnings.catch_warnings(), JudgeServer(handler=answer) as server:
        warnings.simplefilter("ignore")
        try:
            from langchain_openai import ChatOpenAI
            from ragas.dataset_schema import SingleTurnSample
            from ragas.llms import LangchainLLMWrapper
            from ragas.metrics import LLMContextRecall

            llm = LangchainLLMWrapper(
                ChatOpenAI(model="gpt-4o-mini", base_url=server.base_url, api_key="test")
            )
            sample = SingleTurnSample(response=case["reference"], **case)
            asyncio.run(LLMContextRecall(llm=llm).single_turn_ascore(sample))
            captured["legacy"] = server.requests[0]
        except Exception as exc:
            captured["legacy"] = f"{type(exc).__name__}: {exc}"
        server.reset()
        server.handler = answer
        try:
            from openai import AsyncOpenAI
            from ragas.llms import llm_factory
            from ragas.metrics.collections import ContextRecall

            async def collections_call() -> None:
                # The client closes on the loop it ran on (else its GC finalizer finds it shut).
                async with AsyncOpenAI(base_url=server.base_url, api_key="test") as client:
                    metric = ContextRecall(llm=llm_factory("gpt-4o-mini", client=client))
                    await metric.ascore(**case)

            asyncio.run(collections_call())
            captured["collections"] = server.requests[0]
        except Exception as exc:
            captured["collections"] = f"{type(exc).__name__}: {exc}"
    return captured


def our_requests(
    case: dict[str, Any], key: str = "llm_context_recall", **options: Any
) -> list[dict[str, Any]]:
    with JudgeServer() as server:
        judge = scorers.JudgeClient(
            model="openai/test-judge", api_base=server.base_url, api_key="test"
        )
        scorer = scorers.get(key, judge=judge, **options)
        result = scorer.score(**case)
        assert result.status == "scored", result.reason
        return list(server.requests)


def completion_tokens(encoding: Any, bodies: list[dict[str, Any]]) -> int:
    """Tokens of the answers the scripted judge gives (claims restated, short reasons)."""
    return sum(len(encoding.encode(auto_answer(body).content or "")) for body in bodies)


def price_per_token() -> tuple[float, float]:
    import litellm

    info = litellm.model_cost["gpt-4o-mini"]
    return float(info["input_cost_per_token"]), float(info["output_cost_per_token"])


def bench_tokens(ragas_problem: str | None) -> dict[str, Any]:
    encoding = token_counter()
    input_price, output_price = price_per_token()
    out: dict[str, Any] = {}
    print(
        "\nllm_context_recall prompt tokens per sample (cl100k_base, on the request bodies sent; "
        "Ragas' schema tokens, where it sends one, in brackets)"
    )
    for label, case in (
        ("documentation example", DOC_CASE),
        ("10 x 300 chars, 5 sentences", large_case()),
        ("10 x 300 chars of random words, 5 sentences", dense_case()),
    ):
        one_call = our_requests(case, cache=None)
        # split-claims mode: a reference's first trace (two calls), then cached (one call)
        cache = scorers.ReferenceCache()
        split_miss = our_requests(case, split_claims=True, cache=cache)
        split_hit = our_requests(case, split_claims=True, cache=cache)
        assert len(one_call) == 1 and len(split_miss) == 2 and len(split_hit) == 1
        modes = {"one call": one_call, "split, first": split_miss, "split, cached": split_hit}
        row: dict[str, Any] = {}
        for mode, bodies in modes.items():
            prompt = sum(chat_tokens(encoding, b) for b in bodies)
            completion = completion_tokens(encoding, bodies)
            row[mode] = {
                "prompt": prompt,
                "completion": completion,
                "usd_per_1k_traces": 1000 * (prompt * input_price + completion * output_price),
            }
        captured: dict[str, dict[str, Any] | str] = {}
        if not ragas_problem:
            captured = ragas_requests(case)
        for api in ("legacy", "collections"):
            body = captured.get(api)
            row[api] = chat_tokens(encoding, body) if isinstance(body, dict) else None
            row[f"{api}_schema"] = schema_tokens(encoding, body) if isinstance(body, dict) else 0
        out[label] = row
        print(f"  {label}:")
        for mode in modes:
            r = row[mode]
            print(
                f"    recalltrace {mode:<14} {r['prompt']:6d} prompt  {r['completion']:5d} "
                f"completion  ${r['usd_per_1k_traces']:.4f} per 1k traces at gpt-4o-mini prices"
            )
        for api in ("legacy", "collections"):
            value = row[api]
            if ragas_problem:
                print(f"    Ragas {api:<12} not run: {ragas_problem}")
            elif value is None:
                print(f"    Ragas {api:<12} could not be captured: {captured.get(api)}")
            else:
                print(
                    f"    Ragas {api:<20} {value:6d} prompt (+{row[api + '_schema']} schema)"
                    f"   ours (one call) / Ragas = {row['one call']['prompt'] / value:.2f}"
                )
    case = large_case()
    cache = scorers.ReferenceCache()
    entity_modes = {
        "one call": our_requests(case, "context_entity_recall", cache=None),
        "split, first": our_requests(
            case, "context_entity_recall", split_reference=True, cache=cache
        ),
        "split, cached": our_requests(
            case, "context_entity_recall", split_reference=True, cache=cache
        ),
    }
    print("  context_entity_recall on the prose case (split_reference caches the reference's):")
    for mode, bodies in entity_modes.items():
        prompt = sum(chat_tokens(encoding, b) for b in bodies)
        completion = completion_tokens(encoding, bodies)
        usd = 1000 * (prompt * input_price + completion * output_price)
        out[f"entities, {mode}"] = {"calls": len(bodies), "prompt": prompt, "usd": usd}
        print(
            f"    {mode:<17} {len(bodies)} call(s) {prompt:6d} prompt  {completion:5d} completion"
            f"  ${usd:.4f} per 1k traces"
        )
    for label in ("10 x 300 chars, 5 sentences", "10 x 300 chars of random words, 5 sentences"):
        large = out[label]
        if large.get("legacy"):
            inputs_only = (
                large["one call"]["prompt"] - out["documentation example"]["one call"]["prompt"]
            )
            print(
                f"  target: one call <= 0.6x Ragas legacy ({label}) -> "
                f"{large['one call']['prompt'] / large['legacy']:.2f}x; the inputs alone are "
                f"about {inputs_only / large['legacy']:.2f}x"
            )
    return out


# --- 3. throughput ----------------------------------------------------------------------------


def start_server_process(latency: float) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.judge_server",
            "--port",
            "0",
            "--latency",
            str(latency),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    if not line.startswith("READY "):
        process.kill()
        raise SystemExit(f"the judge server did not start: {line!r}")
    return process, line.split(" ", 1)[1]


def throughput_inputs(index: int) -> dict[str, Any]:
    return {
        "user_input": f"Question {index}: where is the Eiffel Tower?",
        "response": "The Eiffel Tower is in Paris. It opened in 1889.",
        # a distinct reference per trace, so nothing is served from the reference cache
        "reference": f"The Eiffel Tower is in Paris. It opened in 1889. Note {index}.",
        "retrieved_contexts": [
            f"Context {index}-{j}: the Eiffel Tower stands in Paris." for j in range(5)
        ],
    }


CALLS_PER_TRACE = {
    "llm_context_recall": 1,
    "chunk_context_recall": 1,
    "judge_context_recall": 1,
    "context_entity_recall": 1,  # one call lists both texts' entities (the default)
}


# (seconds, scored traces, CPU seconds, every scored trace's end, seconds inside ascore summed)
Run = tuple[float, int, float, list[float], float]


async def drive(key: str, base_url: str, traces: int, concurrency: int) -> Run:
    """Score ``traces`` traces with ``concurrency`` in flight.

    Returns (seconds, scored, CPU seconds, the ``time.monotonic()`` of every scored trace's end,
    the seconds one ``ascore`` took, summed over the scored traces). The clock of the marks is
    system-wide, so the marks of several processes can be merged.
    """
    judge = scorers.JudgeClient(
        model=JUDGE_MODEL,
        api_base=base_url,
        api_key="test",
        max_concurrency=concurrency * CALLS_PER_TRACE[key],
        timeout_s=30,
    )
    scorer = scorers.get(key, judge=judge, cache=scorers.ReferenceCache())
    limit = asyncio.Semaphore(concurrency)
    marks: list[float] = []
    scoring = 0.0

    async def one(index: int) -> None:
        nonlocal scoring
        async with limit:
            begun = time.monotonic()
            try:
                result = await scorer.ascore(**throughput_inputs(index))
            except scorers.JudgeError:  # counted as not scored; the run goes on
                return
            if result.status == "scored" and index >= 0:
                marks.append(time.monotonic())
                scoring += marks[-1] - begun

    await asyncio.gather(*(one(-i - 1) for i in range(concurrency)))  # warm-up
    cpu = time.process_time()
    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(traces)))
    return time.perf_counter() - started, len(marks), time.process_time() - cpu, marks, scoring


def steady_rate(marks: list[float]) -> float:
    """Completions per second between the 10% and the 90% mark of a run.

    The start (every slot's first request prepared at once) and the drain at the end (fewer and
    fewer calls in flight) are properties of a finite run, not of a scorer that runs for hours;
    the window leaves both out, as ``benchmarks/worker.py`` does.
    """
    ordered = sorted(marks)
    low, high = len(ordered) // 10, len(ordered) - 1 - len(ordered) // 10
    if high <= low or ordered[high] <= ordered[low]:
        return 0.0
    return (high - low) / (ordered[high] - ordered[low])


async def drive_litellm(base_url: str, calls: int, concurrency: int) -> tuple[float, list[float]]:
    """Bare ``litellm.acompletion`` calls of the same size: what LiteLLM alone can do here.

    Returns (seconds, the ``time.monotonic()`` of every call's end)."""
    import litellm

    body = json.loads(json.dumps(throughput_inputs(0)))
    messages = [
        {"role": "system", "content": 'JSON only: {"context_recall_score":0.0,"reason":"..."}'},
        {"role": "user", "content": json.dumps(body)},
    ]
    limit = asyncio.Semaphore(concurrency)
    marks: list[float] = []

    async def one(timed: bool = True) -> None:
        async with limit:
            await litellm.acompletion(
                model=JUDGE_MODEL,
                api_base=base_url,
                api_key="test",
                messages=messages,
                response_format={"type": "json_object"},
                max_retries=0,
            )
        if timed:
            marks.append(time.monotonic())

    await asyncio.gather(*(one(timed=False) for _ in range(concurrency)))  # warm-up
    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(calls)))
    return time.perf_counter() - started, marks


def child(
    key: str, base_url: str, traces: int, concurrency: int, freeze_gc: bool, litellm_http: bool
) -> None:
    """One of several client processes: warm up, say READY, wait for GO, report."""
    # before timing, as a scoring service
    scorers.load_judge_backend(freeze_gc=freeze_gc, litellm_http=litellm_http)
    print("READY", flush=True)
    sys.stdin.readline()
    elapsed, scored, cpu, marks, scoring = asyncio.run(drive(key, base_url, traces, concurrency))
    report = {"elapsed": elapsed, "scored": scored, "cpu": cpu, "marks": marks, "scoring": scoring}
    print(json.dumps(report), flush=True)


def multi_process(
    key: str, base_url: str, traces: int, processes: int, freeze_gc: bool, litellm_http: bool
) -> Run:
    """Split ``traces`` and the concurrency over ``processes`` client processes; the result as
    :func:`drive`'s, over all of them."""
    children = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.scorers",
                "--child",
                key,
                "--base-url",
                base_url,
                "--traces",
                str(traces // processes + (i < traces % processes)),
                "--concurrency",
                str(CONCURRENCY // processes + (i < CONCURRENCY % processes)),
                *([] if freeze_gc else ["--no-freeze-gc"]),
                *([] if litellm_http else ["--openai-sdk"]),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for i in range(processes)
    ]
    try:
        for proc in children:
            assert proc.stdout is not None
            proc.stdout.readline()
        for proc in children:
            assert proc.stdin is not None
            proc.stdin.write("GO\n")
            proc.stdin.flush()
        reports = []
        for proc in children:
            assert proc.stdout is not None
            reports.append(json.loads(proc.stdout.readline()))
            proc.wait(60)
    finally:
        for proc in children:
            if proc.poll() is None:
                proc.kill()
    return (
        max(r["elapsed"] for r in reports),
        sum(r["scored"] for r in reports),
        sum(r["cpu"] for r in reports),
        [mark for r in reports for mark in r["marks"]],
        sum(r["scoring"] for r in reports),
    )


def calibrate() -> float:
    """Milliseconds a fixed piece of pure-Python work takes now, best of five.

    The machine's speed drifts between minutes, and with it every figure of a run. Printed
    beside each round, this shows when pure-Python work ran slow; not every slowdown shows in
    it (the client CPU per judge call, printed per run, is the direct measure).
    """
    payload = {"claims": [{"claim": f"claim {i}", "attributed": i % 2 == 0} for i in range(40)]}
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(300):
            decoded = json.loads(json.dumps(payload))
            sum(1 for claim in decoded["claims"] if claim["attributed"])
            sorted(f"{key}:{value}" for key, value in enumerate(decoded["claims"]))
        best = min(best, time.perf_counter() - started)
    return best * 1000


def describe(run: Run, server_s: float, traces: int, calls: int, bound: float) -> dict[str, Any]:
    """The figures of one run of a variant: steady rate, share of the bound, CPU per call."""
    elapsed, scored, cpu, marks, scoring = run
    rate = steady_rate(marks)
    return {
        "rate": rate,
        "share": rate / bound,
        "whole_share": scored / elapsed / bound,
        "scored": scored,
        "ms_per_trace": scoring / max(scored, 1) * 1000,
        "client_ms_per_call": cpu / (traces * calls) * 1000,
        "server_ms_per_call": server_s / (traces * calls) * 1000,
    }


def run_line(key: str, figures: dict[str, Any], traces: int) -> str:
    return (
        f"    {key:<22} {figures['rate']:6.1f} traces/s {figures['share']:.2f} "
        f"[{figures['whole_share']:.2f}] {figures['ms_per_trace']:3.0f} ms "
        f"({figures['client_ms_per_call']:.2f}, {figures['server_ms_per_call']:.2f})"
        + ("" if figures["scored"] == traces else f" {figures['scored']}/{traces} scored")
    )


TARGET_SHARE = 0.8


def bench_throughput(
    traces: int, processes: int, repeats: int, freeze_gc: bool, litellm_http: bool
) -> dict[str, Any]:
    process, base_url = start_server_process(LATENCY_S)
    bound = CONCURRENCY / LATENCY_S
    out: dict[str, Any] = {"bound": bound}
    # before timing, as a scoring service
    scorers.load_judge_backend(freeze_gc=freeze_gc, litellm_http=litellm_http)
    setup = [f"freeze_gc={freeze_gc}", f"litellm_http={litellm_http}"]
    print(
        f"\nthroughput through LiteLLM, server latency {LATENCY_S * 1000:.0f} ms, concurrency "
        f"{CONCURRENCY}: bound {bound:.0f} traces/s (judge server in its own process); "
        f"{traces} traces per run; client processes call "
        f"load_judge_backend({', '.join(setup)})\n"
        "  each run: steady rate (between the 10% and the 90% mark of the run), its share of the\n"
        "  bound, [the whole run's share], the mean time of one ascore() (the server holds each\n"
        f"  call for {LATENCY_S * 1000:.0f} ms), (client CPU ms per judge call, server CPU ms per "
        "call)"
    )

    def server_alive() -> None:
        nonlocal process, base_url
        if process.poll() is not None:  # the server died (killed from outside): restart it
            print(f"  (the judge server exited with {process.returncode}; restarted)")
            process, base_url = start_server_process(LATENCY_S)

    def measured(key: str, in_processes: int) -> dict[str, Any]:
        server_alive()
        server_cpu = process_cpu_s(process.pid)
        if in_processes == 1:
            run = asyncio.run(drive(key, base_url, traces, CONCURRENCY))
        else:
            run = multi_process(key, base_url, traces, in_processes, freeze_gc, litellm_http)
        server_s = process_cpu_s(process.pid) - server_cpu
        return describe(run, server_s, traces, CALLS_PER_TRACE[key], bound)

    chosen = os.environ.get(LITELLM_HTTP_FLAG)
    try:
        # LiteLLM reads its route switch on every call: measure both routes, then put it back.
        routes = (("sdk", "OpenAI SDK", "false"), ("http", "own HTTP handler", "true"))
        for route, label, value in routes:
            os.environ[LITELLM_HTTP_FLAG] = value
            server_cpu = process_cpu_s(process.pid)
            cpu = time.process_time()
            elapsed, marks = asyncio.run(drive_litellm(base_url, traces, CONCURRENCY))
            cpu = time.process_time() - cpu
            server_cpu = process_cpu_s(process.pid) - server_cpu
            steady = steady_rate(marks)
            out[f"litellm_alone_{route}"] = {"rate": steady, "whole": traces / elapsed}
            print(
                f"  {'bare acompletion, ' + label:<34} {steady:6.1f} calls/s "
                f"{steady / bound:.2f} [{traces / elapsed / bound:.2f}]  (client "
                f"{cpu / traces * 1000:.2f} ms CPU/call, server {server_cpu / traces * 1000:.2f})"
            )
        if chosen is None:
            os.environ.pop(LITELLM_HTTP_FLAG)
        else:
            os.environ[LITELLM_HTTP_FLAG] = chosen

        if processes > 1:
            print(f"  one process, {CONCURRENCY} in flight, for comparison:")
            for key in CALLS_PER_TRACE:
                out.setdefault(key, {})["one"] = figures = measured(key, 1)
                print(run_line(key, figures, traces))
        # The machine's speed drifts between minutes: every round runs each variant once, so a
        # slow minute falls on one round of every variant, not on every round of one.
        layout = f"{processes} processes" if processes > 1 else "one process"
        for round_no in range(1, repeats + 1):
            print(f"  {layout}, round {round_no} of {repeats} (calibration {calibrate():.1f} ms):")
            for key in CALLS_PER_TRACE:
                figures = measured(key, processes)
                out.setdefault(key, {}).setdefault("rounds", []).append(figures)
                print(run_line(key, figures, traces))
        print(
            f"  {layout}: median share of the bound over {repeats} round(s) "
            f"(lowest to highest); target {TARGET_SHARE}"
        )
        for key in CALLS_PER_TRACE:
            shares = [figures["share"] for figures in out[key]["rounds"]]
            median = statistics.median(shares)
            out[key]["median_share"] = median
            print(
                f"    {key:<22} {median:.2f} ({min(shares):.2f} to {max(shares):.2f})  "
                + ("met" if median >= TARGET_SHARE else "MISSED")
            )
        print(f"  bound: concurrency / latency = {bound:.0f} traces/s; one judge call per trace")
    finally:
        process.terminate()
        process.wait(10)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description="scorer benchmarks")
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--traces", type=int, default=4000, help="traces per throughput run")
    parser.add_argument(
        "--processes",
        type=int,
        default=4,
        help="client processes sharing the 64 in flight (1 for one process only)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="rounds of the throughput runs; each variant's figure is the median of its rounds",
    )
    parser.add_argument("--skip", nargs="*", default=[], choices=["speed", "tokens", "throughput"])
    parser.add_argument(
        "--no-freeze-gc",
        dest="freeze_gc",
        action="store_false",
        help="measure throughput without scorers.load_judge_backend(freeze_gc=True)",
    )
    parser.add_argument(
        "--openai-sdk",
        dest="litellm_http",
        action="store_false",
        help="score through the OpenAI SDK: without load_judge_backend(litellm_http=True)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--base-url", help=argparse.SUPPRESS)
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(
            args.child,
            args.base_url,
            args.traces,
            args.concurrency,
            args.freeze_gc,
            args.litellm_http,
        )
        return
    problem = ragas_available()
    if problem:
        print(f"Ragas is not available ({problem}); its columns are left out.")
    if "speed" not in args.skip:
        bench_non_llm(args.samples, problem)
    if "tokens" not in args.skip:
        bench_tokens(problem)
    if "throughput" not in args.skip:
        bench_throughput(
            args.traces, args.processes, args.repeats, args.freeze_gc, args.litellm_http
        )


if __name__ == "__main__":
    main()
