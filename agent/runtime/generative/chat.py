"""The prompt of a chat: the model's own chat template when its bundle has one, else a plain one.

The plain template, for models trained without a chat format (tinylm), is one line per message and an open
assistant turn:

    system: You are terse.
    user: Write a loop.
    assistant:
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from edgefleet.agent.runtime.generative.session import GenerativeSession

ROLES = ("system", "user", "assistant", "tool", "developer")


def plain_chat_prompt(messages: Sequence[Mapping[str, str]]) -> str:
    lines = [f"{m['role']}: {m['content']}" for m in messages]
    return "\n".join([*lines, "assistant:"])


def chat_prompt(session: GenerativeSession, messages: Sequence[Mapping[str, str]]) -> tuple[str, str]:
    """(prompt, which template made it: "model" or "plain")."""
    templated = session.apply_chat_template(messages)
    if templated is not None:
        return templated, "model"
    return plain_chat_prompt(messages), "plain"


__all__ = ["ROLES", "chat_prompt", "plain_chat_prompt"]
