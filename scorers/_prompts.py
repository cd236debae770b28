"""What the judge prompts share: the task shape, the input tags and the schema helper.

Every prompt token is paid for on every trace, so the instructions are short and the inputs go in
light tags. Each prompt states its output shape in one line, which serves JSON mode (where no
schema can be sent) and keeps answers the same shape across providers. Changing a prompt, a
schema or the parsing means bumping the variant's version in ``scorers.catalog``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: Bump when any judge task's prompt text changes; part of the reference cache key.
PROMPT_VERSION = "1"

RETRY_NOTE = "Your reply was invalid: {problem} Answer again, JSON only, in the required shape."


def joined(items: Sequence[str]) -> str:
    """Passages separated by blank lines, where the judge never needs to refer to one by id."""
    return "\n\n".join(items)


def numbered(items: Sequence[str]) -> str:
    """Items on their own lines as ``[0] text``, ``[1] text``: the ids the judge refers to."""
    return "\n".join(f"[{index}] {item}" for index, item in enumerate(items))


def tagged(**parts: str) -> str:
    """Inputs wrapped in light tags, e.g. ``<question>...</question>``, in the given order."""
    return "\n".join(f"<{name}>\n{text}\n</{name}>" for name, text in parts.items())


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
