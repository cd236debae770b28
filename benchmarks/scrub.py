"""Scrubbing: recall, precision and time per record, the previous detector and the current one
side by side.

- Recall: the kinds of the secrets corpus (``tests/reliability/secret_kinds.py``: one example
  of every shipped rule-file rule plus split, encoded, wrapped, full-width, Arabic-Indic and
  other-language variants), each planted in a sentence and scrubbed; a kind is caught when no
  12 characters of it remain.
- Precision: the ordinary engineering sentences (``tests/reliability/ordinary_corpus.py``)
  scrubbed; a sentence counts as altered when the output differs from the input.
- Time per record: ``scrub_record`` on records of a question, an answer and ten 300-character
  documents, of two sorts: cut from the ordinary corpus (engineering text, where most gates
  pass) and prose of plain words (as ``benchmarks.tracer_overhead`` uses); each record timed
  by the thread's CPU clock, the two detectors taking records in turn (order alternating), the
  median kept (the least disturbed by other load on the machine).

The previous detector is the ``tracer/_scrub.py`` of the commit before the one that replaced it
(found with git), loaded beside the current one in this process.

Targets (exit status 1 when one is missed): every corpus kind caught; at most 1 in 100
ordinary sentences altered; time per record at most 1.2 times the previous detector's, on
both sorts of documents.

Run: ``python -m benchmarks.scrub [--records 300] [--blocks 5] [--baseline REF]``
"""

from __future__ import annotations

import argparse
import copy
import statistics
import subprocess
import sys
import time
import types
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import recalltrace
from recalltrace.storage.records import ContextRecord, TraceRecord
from recalltrace.tracer._scrub import Scrubber
from tests.reliability.ordinary_corpus import SENTENCES
from tests.reliability.secret_kinds import Kind, all_kinds, leaked_kinds

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = 10
DOCUMENT_CHARS = 300
TIME_RATIO_TARGET = 1.2
ALTERED_TARGET = 0.01


def previous_scrubber(ref: str | None) -> tuple[str, Any]:
    """The scrubber of ``ref`` (default: the commit before ``tracer/_scrub.py`` became a
    package), as a class loaded from that commit's source."""

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise SystemExit(f"git {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout.strip()

    if ref is None:
        removed = git("log", "-1", "--format=%H", "--diff-filter=D", "--", "tracer/_scrub.py")
        if not removed:
            raise SystemExit("no commit removed tracer/_scrub.py; pass --baseline REF")
        ref = f"{removed}~1"
    source = git("show", f"{ref}:tracer/_scrub.py")
    module = types.ModuleType("previous_scrub")
    module.__dict__["__name__"] = "previous_scrub"
    sys.modules["previous_scrub"] = module
    exec(compile(source, f"{ref}:tracer/_scrub.py", "exec"), module.__dict__)
    return git("rev-parse", "--short", ref), module.Scrubber(recalltrace.ScrubbingOptions())


def recall(scrubber: Any, kinds: list[Kind]) -> list[str]:
    """The kinds that get through."""
    missed = []
    for kind in kinds:
        text = f"From the runbook: {kind.text} (rotate it quarterly)."
        if leaked_kinds(scrubber.scrub_text(text, "f", []), [kind]):
            missed.append(kind.name)
    return missed


def altered(scrubber: Any) -> list[str]:
    return [text for text in SENTENCES if scrubber.scrub_text(text, "f", []) != text]


def prose_text(seed: int, length: int) -> str:
    """Made-up document text of whole words (as ``benchmarks.tracer_overhead`` uses)."""
    words = ("context", "recall", "retrieval", "answer", "document", "vector", "query", "score")
    out: list[str] = []
    index = seed
    while sum(len(word) + 1 for word in out) < length:
        out.append(words[index % len(words)])
        index += 3
    return " ".join(out)[:length]


def records(count: int, prose: bool = False) -> list[TraceRecord]:
    """Records of ten documents: cut from the ordinary engineering corpus (identifiers,
    numbers, paths and code in most sentences), or prose of plain words."""
    corpus = " ".join(SENTENCES)
    out = []
    for index in range(count):
        documents = []
        for position in range(DOCUMENTS):
            start = (index * 7919 + position * 3301) % (len(corpus) - DOCUMENT_CHARS)
            documents.append(
                ContextRecord(
                    prose_text(index + position, DOCUMENT_CHARS)
                    if prose
                    else corpus[start : start + DOCUMENT_CHARS],
                    id=f"doc-{index}-{position}",
                    score=0.5,
                    metadata={"source": f"runbook-{position}.md", "page": position},
                )
            )
        out.append(
            TraceRecord(
                trace_id=f"{index:032x}",
                app_name="support-bot",
                service_name="rag-api",
                started_at=datetime.now(timezone.utc),
                duration_ms=12.5,
                user_input="How does the worker retry failed scoring jobs after a timeout?",
                response="It retries three times with exponential backoff, up to 30 seconds.",
                retrieved_contexts=documents,
                metadata={"tenant": "acme", "channel": "web"},
            )
        )
    return out


def time_per_record(
    scrubbers: dict[str, Any], count: int, blocks: int, prose: bool
) -> dict[str, float]:
    """The median thread CPU time per record of each scrubber: records taken in turn by each
    (the order alternating), so that load on the machine falls on all alike."""
    template = records(count, prose)
    names = list(scrubbers)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for block in range(blocks):
        # Every pass sees the documents for the first time: the contents a scrubber found
        # clean in an earlier pass would not be gated again (a real stream repeats documents
        # too, but how often is the application's; this is the cost of new ones).
        for scrubber in scrubbers.values():
            if hasattr(scrubber, "_clean_contents"):
                scrubber._clean_contents.clear()
                scrubber._clean_content_chars = 0
        batches = {name: copy.deepcopy(template) for name in names}
        for index in range(count):
            order = names if (index + block) % 2 == 0 else names[::-1]
            for name in order:
                record = batches[name][index]
                started = time.thread_time()
                scrubbers[name].scrub_record(record)
                samples[name].append(time.thread_time() - started)
    return {name: statistics.median(values) for name, values in samples.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=300, help="distinct records timed")
    parser.add_argument("--blocks", type=int, default=5, help="passes over the records")
    parser.add_argument("--baseline", default=None, help="git ref of the previous detector")
    args = parser.parse_args(argv)
    if args.records < 1 or args.blocks < 1:
        parser.error("--records and --blocks must be at least 1")
    ref, previous = previous_scrubber(args.baseline)
    current = Scrubber(recalltrace.ScrubbingOptions())
    kinds = all_kinds()
    detectors = {f"previous ({ref})": previous, "current": current}
    results: dict[str, dict[str, Any]] = {}
    for name, scrubber in detectors.items():
        results[name] = {"missed": recall(scrubber, kinds), "altered": altered(scrubber)}
    timings = {
        kind: time_per_record(detectors, args.records, args.blocks, kind == "prose")
        for kind in ("engineering", "prose")
    }
    print(f"corpus: {len(kinds)} kinds of secrets, {len(SENTENCES)} ordinary sentences; "
          f"records of {DOCUMENTS} x {DOCUMENT_CHARS}-character documents")  # fmt: skip
    print(f"{'detector':<22} {'recall':>16} {'unchanged':>16} {'us/record':>12} {'(prose)':>8}")
    for name in detectors:
        caught = len(kinds) - len(results[name]["missed"])
        kept = len(SENTENCES) - len(results[name]["altered"])
        print(
            f"{name:<22} {caught:>5}/{len(kinds):<4} {caught / len(kinds):>5.1%} "
            f"{kept:>5}/{len(SENTENCES):<4} {kept / len(SENTENCES):>5.1%} "
            f"{timings['engineering'][name] * 1e6:>12.1f} {timings['prose'][name] * 1e6:>8.1f}"
        )
    current_result = results["current"]
    ratios = {
        kind: timing["current"] / timing[f"previous ({ref})"] for kind, timing in timings.items()
    }
    for kind, ratio in ratios.items():
        print(f"time ratio current/previous, {kind} documents: {ratio:.2f} "
              f"(target <= {TIME_RATIO_TARGET})")  # fmt: skip
    for text in current_result["altered"]:
        print(f"  altered: {text}")
    for name in current_result["missed"]:
        print(f"  missed: {name}")
    failures = []
    if current_result["missed"]:
        failures.append(f"{len(current_result['missed'])} kinds missed")
    if len(current_result["altered"]) > ALTERED_TARGET * len(SENTENCES):
        failures.append(f"{len(current_result['altered'])} ordinary sentences altered")
    for kind, ratio in ratios.items():
        if ratio > TIME_RATIO_TARGET:
            failures.append(f"time ratio {ratio:.2f} above {TIME_RATIO_TARGET} ({kind})")
    if failures:
        print("TARGET MISSED: " + "; ".join(failures))
        return 1
    print("all targets met")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
