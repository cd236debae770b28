"""Judge tokens per scored request of ``pooled_context_recall``, batched against one call per
document.

Run from the repository root:

    python -m benchmarks.pooled_tokens

For pools of 20 and 50 documents of 300 characters (the 5 retrieved documents among them), the
scorer runs through LiteLLM against the scripted judge server, which grades every document; the
request bodies it receives are counted with tiktoken's cl100k_base as OpenAI counts chat
prompts (content plus 3 per message and 3 per request, the JSON schema sent beside them), and
the answers the same way. ``batch_size=5`` (the default) is set against ``batch_size=1``. The
answers are the scripted judge's (one short reason per document), so completion tokens are
indicative; prompt tokens are exact for these inputs.
"""

from __future__ import annotations

import asyncio
import json
import random
import string
from typing import Any

from benchmarks.scorers import chat_tokens, schema_tokens, token_counter
from recalltrace import scorers
from recalltrace.scorers.variants.pooled_context_recall import MemoryJudgments
from tests.support.judge_server import JudgeServer, auto_answer


def _document(rng: random.Random, size: int = 300) -> str:
    words = []
    while sum(len(w) + 1 for w in words) < size:
        words.append("".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 9))))
    return " ".join(words)[:size]


def measure(pool_size: int, batch_size: int, encoding: Any) -> dict[str, float]:
    rng = random.Random(pool_size)
    pool = [_document(rng) for _ in range(pool_size)]
    retrieved = pool[:5]
    answers: list[str] = []

    def answer(request: dict[str, Any]) -> Any:
        reply = auto_answer(request)
        answers.append(reply.content or "")
        return reply

    with JudgeServer(handler=answer) as server:
        judge = scorers.JudgeClient(
            model="openai/test-judge", api_base=server.base_url, api_key="test"
        )
        scorer = scorers.get(
            "pooled_context_recall",
            judge=judge,
            batch_size=batch_size,
            judgments=MemoryJudgments(),
        )
        result = asyncio.run(
            scorer.ascore(
                user_input="Which documents answer the question about the topic?",
                retrieved_contexts=retrieved,
                pool_contexts=pool,
            )
        )
        assert result.status == "scored", result.reason
        bodies = list(server.requests)
    prompt = sum(chat_tokens(encoding, b) + schema_tokens(encoding, b) for b in bodies)
    completion = sum(len(encoding.encode(a)) for a in answers)
    return {"calls": len(bodies), "prompt": prompt, "completion": completion}


def main() -> None:
    encoding = token_counter()
    print("| pool size | batch | calls | prompt tokens | completion tokens | total |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    rows = []
    for pool_size in (20, 50):
        for batch_size in (5, 1):
            row = measure(pool_size, batch_size, encoding)
            rows.append({"pool_size": pool_size, "batch_size": batch_size, **row})
            total = row["prompt"] + row["completion"]
            print(
                f"| {pool_size} | {batch_size} | {row['calls']:.0f} | {row['prompt']:.0f} | "
                f"{row['completion']:.0f} | {total:.0f} |"
            )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
