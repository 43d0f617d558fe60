"""Which control-plane instance drives the rollouts: a lease row in the store with a fencing token.

Every instance calls `renew()` from its own thread, a few times per `ttl_s` (never held up by a slow engine
tick or a desired-state sync waiting for the broker). The holder renews its lease; the others take it once it
has expired. A new holder gets a new term (a larger token) and a store view (`Store.with_fence`)
whose rollout-state writes (rollouts, deployments, published desired state, taken commands) each check, in
their own transaction, that the term is still current. So a holder that stalls (a long GC pause, a
partition from the database) and wakes up after another took over writes nothing: its writes raise
`FencedOut`, and it steps down.

Takeover bound: a holder that dies renewed at most `ttl_s` before; the next instance to tick after the
lease expired takes it. Another instance drives the rollouts within `ttl_s + tick_s` of the holder's death
(11 s with the defaults) plus one tick's work, and it reads the rollouts where the store left them. The bound
assumes the instances' clocks agree (NTP): a clock that is ahead by d seconds takes over d seconds early.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from edgefleet.control.store import Fence, Store

log = logging.getLogger(__name__)


class Leadership:
    def __init__(self, store: Store, lease: str, holder: str, ttl_s: float, clock: Callable[[], float] = time.time):
        self.store, self.lease, self.holder, self.ttl_s, self.clock = store, lease, holder, ttl_s, clock
        self._lock = threading.Lock()
        self._fence: Fence | None = None
        self._fenced_store: Store | None = None

    @property
    def leader(self) -> bool:
        return self._fence is not None

    @property
    def fence(self) -> Fence | None:
        return self._fence

    def term(self) -> tuple[Fence | None, Store | None]:
        """(the current term, the store view fenced by it), or (None, None) when another instance leads."""
        with self._lock:
            return self._fence, self._fenced_store

    def renew(self) -> bool:
        """Take or renew the lease; True when this instance holds it now. A new term makes a new fenced view."""
        token = self.store.acquire_lease(self.lease, self.holder, self.ttl_s, self.clock())
        with self._lock:
            if token is None:
                if self._fence is not None:
                    log.warning("lost the %s lease (term %d) to another instance", self.lease, self._fence.token)
                self._fence, self._fenced_store = None, None
                return False
            if self._fence is None or self._fence.token != token:
                log.info("took the %s lease: term %d", self.lease, token)
                self._fence = Fence(self.lease, self.holder, token)
                self._fenced_store = self.store.with_fence(self._fence)
            return True

    def step_down(self, reason: str, fence: Fence | None) -> None:
        """Forget `fence` (a write under it was fenced out): the next `renew()` finds out who leads now."""
        with self._lock:
            if fence is None or self._fence != fence:
                return
            log.warning("stepping down from the %s lease (term %d): %s", self.lease, fence.token, reason)
            self._fence, self._fenced_store = None, None

    def release(self) -> None:
        with self._lock:
            if self._fence is None:
                return
            self._fence, self._fenced_store = None, None
        self.store.release_lease(self.lease, self.holder)
