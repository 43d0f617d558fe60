"""Attacks on the dashboard's HTTP server, each counted in the attack ledger: a real server (uvicorn, the
shipped configuration but for a shorter request deadline) on a real SQLite store.

- 1,200 idle connections: a logged-in request is still answered at once, and the server closes them all once the
  request deadline has passed.
- A slow client trickling one header byte at a time (slowloris) is cut off at the deadline.
- 500 failed logins from one source: throttled (429 with Retry-After) after the first few, the audit trail gets a
  handful of rows instead of 500, and a valid token still logs in from that source.
- A session cookie reused after logout is refused; the cookie never carries the token.
- 300 POSTs from nobody (no token, a made-up session): throttled, and audited in a couple of rows, not 300.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgefleet.control.dashboard import auth
from edgefleet.control.dashboard import server as dashboard_server
from edgefleet.control.dashboard.server import DashboardServer
from edgefleet.control.store import Store, open_store
from edgefleet.core.messages import DeviceStatus

from support.attacks.ledger import AttackLedger

DEADLINE_S = 2.0


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = open_store(f"sqlite://{tmp_path}/control.sqlite")
    store.upsert_statuses([DeviceStatus(device_id="dev-1", online=True, state="serving")], time.time())
    yield store
    store.close()


@pytest.fixture
def server(store: Store, monkeypatch: pytest.MonkeyPatch) -> Iterator[DashboardServer]:
    monkeypatch.setattr(dashboard_server, "REQUEST_DEADLINE_S", DEADLINE_S)
    server = DashboardServer(store, "127.0.0.1", 0).start()
    yield server
    server.stop()


def address(server: DashboardServer) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").rstrip("/").split(":")
    return host, int(port)


def get(server: DashboardServer, path: str, headers: dict[str, str], body: bytes | None = None,
        method: str = "GET") -> tuple[int, dict[str, str], bytes]:  # fmt: skip
    conn = http.client.HTTPConnection(*address(server), timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def closed_by_server(sock: socket.socket, wait: float) -> bool:
    sock.settimeout(wait)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_idle_connections_do_not_starve_the_dashboard_and_are_closed_at_the_deadline(
    server: DashboardServer, store: Store, attack_ledger: AttackLedger
) -> None:
    token = auth.issue_token(store, "alice")
    idle = [socket.create_connection(address(server)) for _ in range(1200)]
    try:
        started = time.monotonic()
        status, _, body = get(server, "/api/fleet", {"Authorization": f"Bearer {token}"})
        answered_s = time.monotonic() - started
        served = status == 200 and json.loads(body)["devices"][0]["device_id"] == "dev-1"
        time.sleep(DEADLINE_S + 1.0)
        still_open = sum(1 for s in idle if not closed_by_server(s, 0.05))
    finally:
        for sock in idle:
            sock.close()
    after, _, _ = get(server, "/api/fleet", {"Authorization": f"Bearer {token}"})
    detail = (
        f"1200 idle connections: a request answered {status} in {answered_s:.2f} s; {still_open} left open "
        f"{DEADLINE_S + 1:g} s later; {server.closed['request_deadline']} closed at the deadline; after: {after}"
    )
    assert not attack_ledger.record(
        "1,200 idle connections to the dashboard", not served or answered_s > 5 or still_open > 0 or after != 200,
        detail,
    ), detail  # fmt: skip


def test_a_slow_client_is_cut_off_at_the_request_deadline(
    server: DashboardServer, store: Store, attack_ledger: AttackLedger
) -> None:
    token = auth.issue_token(store, "alice")
    request = f"GET /api/fleet HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nX-Pad: {'a' * 200}\r\n\r\n"
    sock = socket.create_connection(address(server))
    sent, cut = 0, False
    started = time.monotonic()
    try:
        for byte in request.encode():  # one byte every 50 ms: 14 s for the whole request, were it let through
            try:
                sock.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                cut = True
                break
            sent += 1
            if closed_by_server(sock, 0.05):
                cut = True
                break
    finally:
        sock.close()
    cut_s = time.monotonic() - started
    served, _, _ = get(server, "/api/fleet", {"Authorization": f"Bearer {token}"})
    detail = f"{sent} of {len(request)} bytes sent before the cut at {cut_s:.1f} s (deadline {DEADLINE_S:g} s); " \
             f"a normal request meanwhile: {served}"  # fmt: skip
    assert not attack_ledger.record(
        "slowloris: one header byte every 50 ms", not cut or cut_s > DEADLINE_S + 2 or served != 200, detail
    ), detail


def test_five_hundred_failed_logins_are_throttled_aggregated_and_lock_nobody_out(
    server: DashboardServer, store: Store, attack_ledger: AttackLedger
) -> None:
    token = auth.issue_token(store, "alice")
    form = {"Content-Type": "application/x-www-form-urlencoded", "Origin": server.url.rstrip("/")}
    statuses: dict[int, int] = {}
    retry_after = set()
    for i in range(500):
        status, headers, _ = get(server, "/login", form, f"token=eft_guess-{i}".encode(), "POST")
        statuses[status] = statuses.get(status, 0) + 1
        if status == 429:
            retry_after.add(headers.get("retry-after"))
    server.dashboard.flush_audit(0.0)  # what the server writes when the minute is over
    rows = [e for e in store.audit(limit=1000) if e.action == "login" and e.outcome.startswith("refused")]
    counted = sum(int(e.detail.get("count", 1)) for e in rows)
    status, headers, _ = get(server, "/login", form, f"token={token}".encode(), "POST")
    logged_in = status == 303 and headers.get("location") == "/" and "set-cookie" in headers
    detail = (f"answers {dict(sorted(statuses.items()))}, Retry-After {sorted(v or '-' for v in retry_after)[:3]}; "
              f"{len(rows)} audit rows for them (counting {counted}); a valid token then: {status}")  # fmt: skip
    throttled = statuses.get(429, 0) >= 500 - auth.FREE_FAILURES and None not in retry_after
    assert not attack_ledger.record(
        "500 failed logins from one source", not throttled or len(rows) > 3 or not logged_in, detail
    ), detail
    assert counted == 500, "every failure is counted in the audit trail"


def test_a_session_cookie_is_dead_after_logout_and_never_holds_the_token(
    server: DashboardServer, store: Store, attack_ledger: AttackLedger
) -> None:
    token = auth.issue_token(store, "alice")
    form = {"Content-Type": "application/x-www-form-urlencoded", "Origin": server.url.rstrip("/")}
    _, headers, _ = get(server, "/login", form, f"token={token}".encode(), "POST")
    cookie = headers["set-cookie"].split(";", 1)[0]
    holds_token = token.split("_", 1)[1] in cookie
    status, _, body = get(server, "/api/session", {"Cookie": cookie})
    before = status
    csrf = json.loads(body)["csrf"]
    out, _, _ = get(server, "/logout", {"Cookie": cookie, "Origin": server.url.rstrip("/"), auth.CSRF_HEADER: csrf},
                    b"", "POST")  # fmt: skip
    after, _, answer = get(server, "/api/fleet", {"Cookie": cookie})
    replay, _, _ = get(server, "/api/devices/dev-1/labels", {
        "Cookie": cookie, "Origin": server.url.rstrip("/"), auth.CSRF_HEADER: csrf,
        "Content-Type": "application/json"}, json.dumps({"set": ["owned=yes"]}).encode(), "POST")  # fmt: skip
    labels = store.device("dev-1").labels  # type: ignore[union-attr]
    detail = (
        f"before logout {before}, logout {out}; the same cookie after: GET {after} "
        f"({json.loads(answer).get('error')}), a labelled POST {replay}; cookie holds the token: {holds_token}"
    )
    assert not attack_ledger.record(
        "a session cookie reused after logout", before != 200 or after != 401 or replay != 401 or "owned" in labels
        or holds_token, detail,
    ), detail  # fmt: skip


def test_a_flood_of_posts_from_nobody_is_throttled_and_audited_in_aggregate(
    server: DashboardServer, store: Store, attack_ledger: AttackLedger
) -> None:
    token = auth.issue_token(store, "alice")
    dead = "edgefleet_session=" + "x" * 43
    answers: dict[int, int] = {}
    for i in range(300):  # no credential, then a made-up session cookie
        headers = {"Content-Type": "application/json", **({"Cookie": dead} if i % 2 else {})}
        status, _, _ = get(server, "/api/devices/dev-1/labels", headers, b'{"set": ["owned=yes"]}', "POST")
        answers[status] = answers.get(status, 0) + 1
    server.dashboard.flush_audit(0.0)
    rows = [e for e in store.audit(limit=1000) if e.actor == "anonymous"]
    counted = sum(int(e.detail.get("count", 1)) for e in rows)
    labels = store.device("dev-1").labels  # type: ignore[union-attr]
    ok, _, _ = get(server, "/api/fleet", {"Authorization": f"Bearer {token}"})
    detail = f"answers {dict(sorted(answers.items()))}; {len(rows)} audit rows counting {counted}; an operator: {ok}"
    assert not attack_ledger.record(
        "300 unauthenticated POSTs (no token, a made-up session)",
        "owned" in labels or len(rows) > 3 or counted != 300 or answers.get(429, 0) < 290 or ok != 200, detail,
    ), detail  # fmt: skip
