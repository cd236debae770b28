"""Finding scorers by their catalog key."""

from __future__ import annotations

from typing import Any

from recalltrace.scorers._base import BaseScorer
from recalltrace.scorers._judge import CONFIG_FIELDS, JudgeClient, JudgeConfig
from recalltrace.scorers.catalog import CATALOG, metric_info, variant_module


def scorer_class(key: str) -> type[BaseScorer]:
    """The scorer class of catalog ``key``, from its module (imported on first use, so that
    importing the package stays cheap)."""
    cls: type[BaseScorer] = variant_module(key).SCORER
    return cls


def available() -> list[str]:
    """The metric keys ``get`` accepts, in catalog order."""
    return list(CATALOG)


def get(
    key: str,
    *,
    judge: JudgeClient | None = None,
    model: str | None = None,
    **options: Any,
) -> BaseScorer:
    """Return a ready scorer for the metric ``key``.

    Args:
        key: one of :func:`available`.
        judge: the judge client for LLM variants (ignored by the others).
        model: instead of ``judge``, a LiteLLM model name; a client is built from it and the
            :class:`JudgeConfig` fields among ``options`` (``api_base``, ``timeout_s``...).
        options: the variant's own options, e.g. ``threshold``/``measure`` for
            ``non_llm_context_recall``; ``samples`` and ``cache`` for the LLM variants, with
            ``split_claims`` (``llm_context_recall``) and ``split_reference``
            (``context_entity_recall``).

    Raises:
        KeyError: an unknown key.
        ValueError: an LLM variant without a judge or a model.
        TypeError: an option the variant does not take.
    """
    info = metric_info(key)
    cls = scorer_class(key)
    judge_options = {name: options.pop(name) for name in list(options) if name in CONFIG_FIELDS}
    on_call = options.pop("on_call", None)
    if not info.uses_llm:
        return cls(**options)
    if judge is None:
        if not model:
            raise ValueError(
                f"{key} needs a judge model: pass model='provider/name' or "
                "judge=JudgeClient(...) (--judge-model on the command line)"
            )
        judge = JudgeClient(JudgeConfig(model=model, **judge_options), on_call=on_call)
    elif judge_options or model is not None or on_call is not None:
        raise TypeError("pass judge options either inside judge=JudgeClient(...) or with model=")
    return cls(judge, **options)  # type: ignore[call-arg]
