"""What the judge prompts share: the task shape, the input tags and the schema helper.

Every prompt token is paid for on every trace, so the instructions are short and the inputs go in
light tags. Each prompt states its output shape in one line, which serves JSON mode (where no
schema can be sent) and keeps answers the same shape across providers. Changing a prompt, a
schema or the parsing means bumping the variant's version in ``scorers.catalog``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: Bump when any judge task's prompt text changes; part of the reference cache key.
PROMPT_VERSION = "1"

RETRY_NOTE = "Your reply was invalid: {problem} Answer again, JSON only, in the required shape."


def joined(items: Sequence[str]) -> str:
    """Passages separated by blank lines, where the judge never needs to refer to one by id."""
    return "\n\n".join(items)


#: Every tag the prompts wrap inputs in. Untrusted text (documents, questions, answers,
#: references) can hold these too; :func:`tagged` makes such text inert.
TAGS = ("question", "context", "reference", "claims", "text", "answer", "response")
_TAG_LIKE = re.compile(r"<(\s*/?\s*)(" + "|".join(TAGS) + r")\b", re.IGNORECASE)
_ID_LIKE = re.compile(r"(?m)^(\s*)\[(\d+)\]")
_ID_SHOWN = r"\1(\2)"


def _inert(text: str) -> str:
    """``text`` unable to open or close a prompt tag (``<`` of a tag-like sequence becomes
    ``&lt;``): a document holding ``</context><reference>`` cannot forge a block."""
    return _TAG_LIKE.sub(r"&lt;\1\2", text)


def numbered(items: Sequence[str]) -> str:
    """Items on their own lines as ``[0] text``, ``[1] text``: the ids the judge refers to. A
    line inside an item that starts like an id (``[3] ...``) is shown as ``(3) ...``, so no item
    can forge another's id."""
    return "\n".join(
        f"[{index}] {_ID_LIKE.sub(_ID_SHOWN, item)}" for index, item in enumerate(items)
    )


def tagged(**parts: str) -> str:
    """Inputs wrapped in light tags, e.g. ``<question>...</question>``, in the given order; tag-
    like sequences inside the inputs are made inert first."""
    return "\n".join(f"<{name}>\n{_inert(text)}\n</{name}>" for name, text in parts.items())


def example_of(task: JudgeTask) -> str:
    """The example answer a task's instructions show (after ``JSON only:``), or ``""``."""
    _, found, example = task.system.partition("JSON only:")
    return example.strip() if found else ""


def messages(system: str, user: str) -> list[dict[str, Any]]:
    """A system and a user message in the chat format."""
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def object_schema(properties: dict[str, Any]) -> dict[str, Any]:
    """A JSON schema object of ``properties``, all required and nothing else allowed (what
    strict structured output wants)."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


@dataclass(frozen=True)
class JudgeTask:
    """One question a variant asks the judge: its name (sent as the schema's name), the system
    prompt, and the JSON schema of a valid answer. Each variant module declares its own."""

    name: str
    system: str
    schema: dict[str, Any]
