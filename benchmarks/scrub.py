"""Scrubbing: recall, precision and time per record, the previous detector and the current one
side by side.

- Recall: the kinds of the secrets corpus (``tests/reliability/secret_kinds.py``: one example
  of every shipped rule-file rule plus split, encoded, wrapped, full-width, Arabic-Indic and
  other-language variants), each planted in a sentence and scrubbed; a kind is caught when no
  12 characters of it remain. When the held-out corpus (``tests/reliability/secrets_heldout.py``)
  is there, its recall per family is reported too (no target).
- Precision: the ordinary engineering sentences (``tests/reliability/ordinary_corpus.py``)
  scrubbed; a sentence counts as altered when the output differs from the input.
- Time per record: ``scrub_record`` on records of a question, an answer and ten documents of
  300 characters, 5 KB and 50 KB, of two sorts: engineering text (the ordinary corpus's
  sentences in a shuffled order, some joined by line breaks) and prose of plain words. Every
  document is distinct (no record repeats another's, and the contents a detector found clean
  are forgotten before each pass), so the clean-content memory hides nothing. Each record is
  timed by the thread's CPU clock, the two detectors taking records in turn (order
  alternating), and the median kept (the least disturbed by other load on the machine); MB/s
  is the documents' characters over that time.

The previous detector is the ``tracer/_scrub.py`` of the commit before the one that replaced it
(found with git), loaded beside the current one in this process.

Targets (exit status 1 when one is missed): every corpus kind caught; at most 1 in 100
ordinary sentences altered; the current detector at most 2 ms per record of ten 5 KB documents
and 20 ms of ten 50 KB ones (25 MB/s), on both sorts. At 300 characters the time ratio to the
previous detector is shown, without a target.

Run: ``python -m benchmarks.scrub [--records 200] [--blocks 3] [--baseline REF]`` (records
of 300 characters; a tenth as many at 5 KB, a twenty-fifth at 50 KB; about half a minute)
"""

from __future__ import annotations

import argparse
import copy
import random
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
SIZES = (300, 5_000, 50_000)
# Milliseconds per record of ten documents, at most (current detector).
MS_TARGETS = {5_000: 2.0, 50_000: 20.0}
ALTERED_TARGET = 0.01
_WORDS = (
    "the", "context", "of", "recall", "and", "retrieval", "answer", "a", "document", "vector",
    "query", "score", "to", "worker", "service", "in", "deploy", "configuration", "team", "is",
)  # fmt: skip


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


def held_out_recall(scrubber: Any) -> dict[str, Any] | None:
    """The held-out corpus's report (``secrets_heldout.recall``), when that module exists."""
    try:
        from tests.reliability import secrets_heldout
    except ImportError:
        return None
    report: dict[str, Any] = secrets_heldout.recall(lambda text: scrubber.scrub_text(text, "f", []))
    return report


def second_held_out(scrubber: Any) -> dict[str, Any] | None:
    """The second held-out corpus's report (``secrets_fresh.recall``), when it exists."""
    try:
        from tests.reliability import secrets_fresh
    except ImportError:
        return None
    report: dict[str, Any] = secrets_fresh.recall(lambda text: scrubber.scrub_text(text, "f", []))
    return report


def altered(scrubber: Any) -> list[str]:
    return [text for text in SENTENCES if scrubber.scrub_text(text, "f", []) != text]


def document(rng: random.Random, length: int, prose: bool) -> str:
    """A document of ``length`` characters: ordinary corpus sentences in a random order (some
    after a line break), or sentences of plain words."""
    pieces: list[str] = []
    size = 0
    while size < length:
        if prose:
            words = [rng.choice(_WORDS) for _ in range(rng.randint(8, 20))]
            piece = " ".join(words).capitalize() + ". "
        else:
            piece = rng.choice(SENTENCES) + ("\n" if rng.random() < 0.2 else " ")
        pieces.append(piece)
        size += len(piece)
    return "".join(pieces)[:length]


def records(count: int, length: int, prose: bool, seed: int) -> list[TraceRecord]:
    """Records of ten distinct documents each."""
    rng = random.Random(seed)
    out = []
    for index in range(count):
        documents = [
            ContextRecord(
                document(rng, length, prose),
                id=f"doc-{index}-{position}",
                score=0.5,
                metadata={"source": f"runbook-{position}.md", "page": position},
            )
            for position in range(DOCUMENTS)
        ]
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
    scrubbers: dict[str, Any], count: int, blocks: int, length: int, prose: bool
) -> dict[str, float]:
    """The median thread CPU time per record of each scrubber: records taken in turn by each
    (the order alternating), so that load on the machine falls on all alike."""
    names = list(scrubbers)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for block in range(blocks):
        # New documents in every pass, and the contents found clean before forgotten: this
        # is the cost of documents seen for the first time.
        template = records(count, length, prose, seed=block * 1000 + length + prose)
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
    parser.add_argument("--records", type=int, default=200, help="records at 300 characters")
    parser.add_argument("--blocks", type=int, default=3, help="passes, each of new records")
    parser.add_argument("--baseline", default=None, help="git ref of the previous detector")
    args = parser.parse_args(argv)
    if args.records < 1 or args.blocks < 1:
        parser.error("--records and --blocks must be at least 1")
    ref, previous = previous_scrubber(args.baseline)
    current = Scrubber(recalltrace.ScrubbingOptions())
    kinds = all_kinds()
    old = f"previous ({ref})"
    detectors = {old: previous, "current": current}
    print(f"corpus: {len(kinds)} kinds of secrets, {len(SENTENCES)} ordinary sentences")
    print(f"{'detector':<22} {'kinds caught':>16} {'sentences unchanged':>22}")
    results: dict[str, dict[str, Any]] = {}
    for name, scrubber in detectors.items():
        missed, changed = recall(scrubber, kinds), altered(scrubber)
        results[name] = {"missed": missed, "altered": changed}
        caught, kept = len(kinds) - len(missed), len(SENTENCES) - len(changed)
        print(
            f"{name:<22} {caught:>6}/{len(kinds):<4} {caught / len(kinds):>5.1%} "
            f"{kept:>12}/{len(SENTENCES):<4} {kept / len(SENTENCES):>5.1%}"
        )
    for name, scrubber in detectors.items():
        report = held_out_recall(scrubber)
        if report is None:
            break
        for subset in ("held_out", "all"):
            part = report[subset]
            families = ", ".join(
                f"{family} {caught}/{total}"
                for family, (caught, total) in sorted(part["families"].items())
            )
            print(f"held-out corpus, {name}, {subset}: {part['caught']}/{part['kinds']} "
                  f"({families})")  # fmt: skip
        fresh = second_held_out(scrubber)
        if fresh is not None:
            print(f"second held-out corpus, {name}: {fresh['caught']}/{fresh['kinds']} "
                  f"missed: {', '.join(fresh['missed']) or 'none'}")  # fmt: skip
    failures = []
    print(f"time per record of {DOCUMENTS} distinct documents (thread CPU, median):")
    print(f"{'documents':<22} {'detector':<22} {'ms/record':>10} {'MB/s':>7} {'target':>10}")
    for length in SIZES:
        count = max(4, args.records // {300: 1, 5_000: 10, 50_000: 25}[length])
        for prose in (False, True):
            sort = f"{length:,} chars, {'prose' if prose else 'engineering'}"
            timing = time_per_record(detectors, count, args.blocks, length, prose)
            for name in detectors:
                seconds = timing[name]
                rate = DOCUMENTS * length / seconds / 1e6 if seconds else float("inf")
                target = ""
                if name == "current" and length in MS_TARGETS:
                    target = f"<= {MS_TARGETS[length]:g} ms"
                    if seconds * 1e3 > MS_TARGETS[length]:
                        failures.append(f"{seconds * 1e3:.2f} ms per record at {sort}")
                elif name == "current":
                    target = f"({seconds / timing[old]:.2f}x)"
                print(f"{sort:<22} {name:<22} {seconds * 1e3:>10.3f} {rate:>7.1f} {target:>10}")
    current_result = results["current"]
    for text in current_result["altered"]:
        print(f"  altered: {text}")
    for name in current_result["missed"]:
        print(f"  missed: {name}")
    if current_result["missed"]:
        failures.append(f"{len(current_result['missed'])} kinds missed")
    if len(current_result["altered"]) > ALTERED_TARGET * len(SENTENCES):
        failures.append(f"{len(current_result['altered'])} ordinary sentences altered")
    if failures:
        print("TARGET MISSED: " + "; ".join(failures))
        return 1
    print("all targets met")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
