"""Issue 32's attack 6, as a logged-out dashboard user: a fresh `X-Forwarded-For` on each login guess. uvicorn
trusts proxy headers from 127.0.0.1 by default, so the per-source throttle never triggered and the audit named
whatever source the attacker wrote. The dashboard now reads the header only from a proxy the operator names
(`control serve --trusted-proxy`). Counted in the attack ledger; a real server (uvicorn) on a real SQLite store."""

from __future__ import annotations

import http.client
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgefleet.control.dashboard import auth
from edgefleet.control.dashboard.server import DashboardServer
from edgefleet.control.store import Store, open_store

from support.attacks.ledger import AttackLedger


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = open_store(f"sqlite://{tmp_path}/control.sqlite")
    yield store
    store.close()


def guesses(server: DashboardServer, count: int) -> dict[int, int]:
    host, port = server.url.removeprefix("http://").rstrip("/").split(":")
    answers: dict[int, int] = {}
    for i in range(count):
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        try:
            conn.request("POST", "/login", body=f"token=eft_guess-{i}".encode(), headers={
                "Content-Type": "application/x-www-form-urlencoded", "Origin": server.url.rstrip("/"),
                "X-Forwarded-For": f"198.51.100.{i % 250 + 1}",
            })  # fmt: skip
            status = conn.getresponse().status
        finally:
            conn.close()
        answers[status] = answers.get(status, 0) + 1
    return answers


def test_a_fresh_x_forwarded_for_per_guess_neither_escapes_the_throttle_nor_names_the_source(
    store: Store, attack_ledger: AttackLedger
) -> None:
    server = DashboardServer(store, "127.0.0.1", 0).start()  # the peer is 127.0.0.1: what uvicorn trusted
    try:
        answers = guesses(server, 60)
        server.dashboard.flush_audit(0.0)
    finally:
        server.stop()
    sources = {e.remote for e in store.audit(limit=1000) if e.action == "login"}
    throttled = answers.get(429, 0) >= 60 - auth.FREE_FAILURES
    assert not attack_ledger.record(
        "a fresh X-Forwarded-For on each of 60 login guesses (logged-out dashboard user)",
        not throttled or sources != {"127.0.0.1"},
        f"answers {dict(sorted(answers.items()))}; the audit names the sources {sorted(sources)}",
    )


def test_a_proxy_the_operator_names_is_believed(store: Store) -> None:
    """The other side: behind a named proxy, each client is its own source (one client's guesses lock out no other)."""
    server = DashboardServer(store, "127.0.0.1", 0, trusted_proxies=auth.trusted_proxies(["127.0.0.1"])).start()
    try:
        answers = guesses(server, 20)  # 20 different clients, one guess each
        server.dashboard.flush_audit(0.0)
    finally:
        server.stop()
    assert answers == {303: 20}
    assert {e.remote for e in store.audit(limit=1000) if e.action == "login"} >= {"198.51.100.1", "198.51.100.20"}
