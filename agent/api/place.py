"""What a request holds while it waits or runs (an inference queue place, a generation place), taken only once its
body is complete (`Admission.enter`, agent/api/http/server.py): a client that trickles its body holds a socket and
nothing else. From the head, the routes decide only what costs nothing to hold (the endpoint, the model, the size)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from edgefleet.agent.api.errors import RequestError
from edgefleet.agent.api.http.protocol import Admission, Response


class Held(Protocol):
    def release(self) -> None: ...


H = TypeVar("H", bound=Held)


class Place(Generic[H]):
    """`take()` once the body is complete (a RequestError is answered at once with `refuse(err)`); `held` is then what
    it took, for the handler; `release()` gives it back (nothing when it was never taken)."""

    def __init__(self, take: Callable[[], H], refuse: Callable[[RequestError], Response]) -> None:
        self._take, self._refuse = take, refuse
        self._held: H | None = None

    @property
    def held(self) -> H:
        if self._held is None:
            raise RuntimeError("the request's place was not taken")  # the server calls `enter` before `handle`
        return self._held

    def enter(self) -> Response | None:
        try:
            self._held = self._take()
        except RequestError as err:
            return self._refuse(err)
        return None

    def release(self) -> None:
        if self._held is not None:
            self._held.release()

    def admission(
        self, handle: Callable[[bytes], Response], quick: Callable[[], bool] | None = None,
        body_timeout_s: float | None = None,
    ) -> Admission:  # fmt: skip
        return Admission(handle, self.release, quick, self.enter, body_timeout_s)


__all__ = ["Held", "Place"]
