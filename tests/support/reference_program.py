"""Attach late references by record id, from a configured process of its own.

    python tests/support/reference_program.py DATABASE_URL REFERENCE_WAIT < pairs.json

Reads a JSON list of ``[trace_id, reference]`` pairs from stdin, calls
``recalltrace.set_reference(trace_id, reference=reference)`` for each, flushes, and prints one
JSON object: the references this process gave up (``other_dropped``). It traces no request;
it ends by returning, so its exit drain runs as any application's would.
"""

from __future__ import annotations

import json
import sys

import recalltrace


def main() -> None:
    url, wait = sys.argv[1], float(sys.argv[2])
    pairs = json.load(sys.stdin)
    recalltrace.configure(
        database_url=url,
        sample_rate=1.0,
        service_name="late-references",
        reference_wait=wait,
        shutdown_timeout=60,
    )
    for trace_id, reference in pairs:
        recalltrace.set_reference(trace_id, reference=reference)
    flushed = recalltrace.flush(120)
    ledger = recalltrace.ledger()
    print(json.dumps({"flushed": flushed, "other_dropped": dict(ledger.other_dropped)}))


if __name__ == "__main__":
    main()
