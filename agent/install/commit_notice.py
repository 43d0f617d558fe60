"""The "committed" event survives a crash: the commit records it as owed, this sends what is owed.

The control plane dates an install by that event (control/rollout/engine.py), so it must not be lost. A crash
between the state commit and the spool used to lose it: the restarted agent served the new bundle and never
said it had committed it. Now `Store.commit` writes a `CommitNotice` in the same atomic write as the commit, and
each notice is cleared only once its event is in the disk spool (which keeps it until the broker acknowledges
it). A crash between spooling and clearing sends the event twice, with the same `ts`; consumers take the first
"committed" event per device and bundle, so a repeat changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from edgefleet.agent.install.store import CommitNotice, Store

Emit = Callable[[CommitNotice], bool]  # spools the event; False when the disk could not take it


def announce_commits(store: Store, emit: Emit) -> int:
    """Spool every owed "committed" event, oldest first; returns how many were spooled. Called by the install
    worker after a commit and at start-up, before the worker threads run (so never twice at once)."""
    sent = 0
    for notice in store.load_state().unannounced:
        if not emit(notice):
            break  # a full disk: it stays owed, in order, until the next commit or start-up
        store.mark_announced(notice)
        sent += 1
    return sent


__all__ = ["announce_commits"]
