"""A request's token budget: how many tokens it may generate, from what it asked, the agent's cap and the room the
model's context leaves after the prompt. Pure."""

from __future__ import annotations

from edgefleet.core.errors import DataError


class BudgetError(DataError):
    """The request cannot be served within the model's context or the agent's limits (the caller's fault: a 400)."""


def token_budget(prompt_tokens: int, requested: int | None, *, default: int, cap: int, context_length: int) -> int:
    """Tokens the request may generate: what it asked for (the bundle's `default` when it did not), at most the
    agent's `cap` and the context left after the prompt. BudgetError when nothing can be generated."""
    if prompt_tokens < 1:
        raise BudgetError("the prompt is empty: a generation needs at least one prompt token")
    if requested is not None and requested < 1:
        raise BudgetError(f"max_tokens must be at least 1, not {requested}")
    room = context_length - prompt_tokens
    if room < 1:
        raise BudgetError(
            f"the prompt is {prompt_tokens} tokens and the model's context holds {context_length} tokens, prompt and "
            "answer together: shorten the prompt"
        )
    wanted = default if requested is None else requested
    return max(1, min(wanted, cap, room))


__all__ = ["BudgetError", "token_budget"]
