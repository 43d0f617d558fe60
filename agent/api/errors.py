"""The one error type of the local inference API: an answer other than 200, with the kind it is counted under.

Kinds are either refusals (the caller's fault or a full agent: never counted against the model) or the single
kind "runtime": the model's own run failed on input that passed every check. Only that one reaches health.
"""

from __future__ import annotations

REFUSAL_KINDS = ("bad-request", "not-found", "too-large", "overloaded", "timeout", "unauthorized", "forbidden")
FAILURE_KIND = "runtime"


class RequestError(Exception):
    """An answer other than 200, with the error kind it is counted under."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message
