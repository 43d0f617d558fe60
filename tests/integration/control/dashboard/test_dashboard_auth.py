"""The dashboard's access control over HTTP, against a real server on a real SQLite store: a token from
`edgefleet control token` is needed for everything but the login page; the store keeps only its hash; a login
session is held by the server (the cookie carries an opaque id, never the token) and ends at logout; the
cookie is HttpOnly and SameSite=Strict; a cookie POST needs its session's CSRF token and this server's Origin;
every refusal and every action lands in the audit trail with who did it; any server on the store accepts the
session (no state in the web process); a bind beyond loopback is warned about."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgefleet.control.dashboard import auth
from edgefleet.control.dashboard.server import DashboardServer
from edgefleet.control.store import Store, open_store
from edgefleet.core.messages import DeviceStatus


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = open_store(f"sqlite://{tmp_path}/control.sqlite")
    store.upsert_statuses([DeviceStatus(device_id="dev-1", online=True, state="serving")], time.time())
    yield store
    store.close()


@pytest.fixture
def server(store: Store) -> Iterator[DashboardServer]:
    server = DashboardServer(store, "127.0.0.1", 0).start()
    yield server
    server.stop()


def request(
    server: DashboardServer, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    host, port = server.url.removeprefix("http://").rstrip("/").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def origin(server: DashboardServer) -> str:
    return server.url.rstrip("/")


def login(server: DashboardServer, token: str) -> tuple[str, str]:
    """(Cookie header, CSRF token) after logging in through the form."""
    status, headers, _ = request(server, "POST", "/login", f"token={token}".encode(), {
        "Content-Type": "application/x-www-form-urlencoded", "Origin": origin(server)})  # fmt: skip
    assert status == 303 and headers["location"] == "/", (status, headers)
    set_cookie = headers["set-cookie"]
    assert "HttpOnly" in set_cookie and "SameSite=Strict" in set_cookie and "Path=/" in set_cookie
    cookie = set_cookie.split(";", 1)[0]
    status, _, body = request(server, "GET", "/api/session", headers={"Cookie": cookie})
    assert status == 200
    return cookie, json.loads(body)["csrf"]


def label(server: DashboardServer, headers: dict[str, str]) -> tuple[int, Any]:
    body = json.dumps({"set": ["site=berlin"]}).encode()
    status, _, answer = request(server, "POST", "/api/devices/dev-1/labels", body,
                                {"Content-Type": "application/json", **headers})  # fmt: skip
    return status, json.loads(answer)


def test_everything_but_the_login_page_needs_a_token(server: DashboardServer, store: Store) -> None:
    token = auth.issue_token(store, "alice")
    paths = ("/api/fleet", "/api/rollouts", "/api/audit", "/api/session", "/api/devices/dev-1/series", "/metrics")
    for failures, path in enumerate(paths, start=1):
        status, _, _ = request(server, "GET", path)
        assert status == 401, (path, status)
        status, headers, _ = request(server, "GET", path, headers={"Authorization": "Bearer eft_not-a-token"})
        # a source that failed too often is told to wait, and a valid token still works from it
        assert status == (401 if failures < auth.FREE_FAILURES else 429), (path, status)
        assert (status == 429) == ("retry-after" in headers)
        status, _, _ = request(server, "GET", path, headers={"Authorization": f"Bearer {token}"})
        assert status == 200, (path, status)
    status, headers, _ = request(server, "GET", "/")
    assert status == 303 and headers["location"] == "/login"
    assert request(server, "GET", "/login")[0] == 200 and request(server, "GET", "/healthz")[0] == 200
    _, headers, _ = request(server, "GET", "/login")
    assert "frame-ancestors 'none'" in headers["content-security-policy"]


def test_the_store_keeps_only_the_hash_and_revoking_or_expiry_ends_access(
    server: DashboardServer, store: Store, tmp_path: Path
) -> None:
    token = auth.issue_token(store, "alice")
    short = auth.issue_token(store, "bob", ttl_s=60, now=time.time() - 120)
    for path in tmp_path.glob("control.sqlite*"):
        assert token.encode() not in path.read_bytes()
    assert [t.token_hash for t in store.tokens() if t.name == "alice"] == [auth.hash_token(token)]
    cookie, _ = login(server, token)
    status, _, body = request(server, "GET", "/api/fleet", headers={"Authorization": f"Bearer {short}"})
    assert status == 401 and b"expired" in body
    assert store.revoke_token("alice", time.time())
    assert request(server, "GET", "/api/fleet", headers={"Authorization": f"Bearer {token}"})[0] == 401
    status, _, body = request(server, "GET", "/api/fleet", headers={"Cookie": cookie})
    assert status == 401 and b"revoked" in body, "a revoked token's sessions end at once"
    reissued = auth.issue_token(store, "alice")
    assert request(server, "GET", "/api/fleet", headers={"Authorization": f"Bearer {reissued}"})[0] == 200


def test_a_wrong_token_at_login_sets_no_cookie_and_is_audited(server: DashboardServer, store: Store) -> None:
    status, headers, _ = request(server, "POST", "/login", b"token=eft_guess", {
        "Content-Type": "application/x-www-form-urlencoded", "Origin": origin(server)})  # fmt: skip
    assert status == 303 and headers["location"] == "/login?failed=1" and "set-cookie" not in headers
    (entry,) = store.audit()
    assert (entry.actor, entry.action, entry.outcome) == ("anonymous", "login", "refused: unknown token")


def test_a_cookie_post_needs_its_csrf_token_and_this_origin(server: DashboardServer, store: Store) -> None:
    token = auth.issue_token(store, "alice")
    cookie, csrf = login(server, token)
    _, other_csrf = login(server, token)
    assert csrf != other_csrf, "each login has its own CSRF token"

    same = {"Cookie": cookie, "Origin": origin(server)}
    assert label(server, same)[0] == 403  # no CSRF token
    assert label(server, {**same, auth.CSRF_HEADER: other_csrf})[0] == 403  # another session's
    assert label(server, {"Cookie": cookie, auth.CSRF_HEADER: csrf})[0] == 403  # no Origin
    assert label(server, {**same, "Origin": "http://evil.example", auth.CSRF_HEADER: csrf})[0] == 403
    assert store.device("dev-1").labels == {}  # type: ignore[union-attr]

    status, answer = label(server, {**same, auth.CSRF_HEADER: csrf})
    assert status == 200 and answer == {"device_id": "dev-1", "labels": {"site": "berlin"}}
    # A bearer request carries no ambient credential: no CSRF token needed.
    status, _ = label(server, {"Authorization": f"Bearer {token}"})
    assert status == 200

    entries = store.audit()
    refused = [e for e in entries if e.outcome.startswith("refused")]
    assert len(refused) == 4 and all(e.actor == "token:alice" and e.action == "device.label" for e in refused)
    assert any("CSRF" in e.outcome for e in refused) and any("cross-origin" in e.outcome for e in refused)
    done = [e for e in entries if e.action == "device.label" and e.outcome == "ok"]
    assert len(done) == 2 and all(e.actor == "token:alice" and e.via == "dashboard" for e in done)
    assert done[0].detail == {"set": ["site=berlin"], "remove": []} and done[0].remote == "127.0.0.1"


def test_a_failed_action_is_audited_and_answered_with_its_reason(server: DashboardServer, store: Store) -> None:
    token = auth.issue_token(store, "alice")
    bearer = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    status, _, body = request(server, "POST", "/api/rollouts/nope/abort", b"{}", bearer)
    assert status == 404 and b"unknown rollout 'nope'" in body
    status, _, body = request(server, "POST", "/api/rollouts", json.dumps({"bundles": ["x"], "group": "g"}).encode(),
                              bearer)  # fmt: skip
    assert status == 404 and b"unknown published bundle 'x'" in body
    status, _, body = request(server, "POST", "/api/desired", b"[1]", bearer)
    assert status == 400
    status, _, _ = request(server, "POST", "/api/devices/dev-1/labels", b"x" * (70 * 1024), bearer)
    assert status == 413
    trail = [(e.action, e.outcome.split(":")[0]) for e in reversed(store.audit())]
    assert trail == [("rollout.abort", "failed"), ("rollout.start", "failed"), ("desired.set", "failed")]


def test_any_server_on_the_store_accepts_the_session(server: DashboardServer, store: Store, tmp_path: Path) -> None:
    cookie, csrf = login(server, auth.issue_token(store, "alice"))
    other_store = open_store(f"sqlite://{tmp_path}/control.sqlite")
    other = DashboardServer(other_store, "127.0.0.1", 0).start()
    try:
        status, _ = label(other, {"Cookie": cookie, "Origin": origin(other), auth.CSRF_HEADER: csrf})
        assert status == 200
    finally:
        other.stop()
        other_store.close()


def test_binding_beyond_loopback_is_warned_about() -> None:
    assert auth.bind_warning("127.0.0.1", 8780) is None and auth.bind_warning("::1", 8780) is None
    assert auth.bind_warning("localhost", 8780) is None
    warning = auth.bind_warning("0.0.0.0", 8780)
    assert warning is not None and warning.startswith("WARNING") and "plain HTTP" in warning


def test_the_token_command_issues_lists_and_revokes(tmp_path: Path) -> None:
    store_url = f"sqlite://{tmp_path}/cli.sqlite"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "edgefleet", "control", "token", "--store", store_url, *args],
                              capture_output=True, text=True, timeout=60)  # fmt: skip

    issued = cli("--name", "carol", "--ttl", "1d", "--json")
    assert issued.returncode == 0, issued.stderr
    token = json.loads(issued.stdout)["token"]
    store = open_store(store_url)
    try:
        assert auth.authenticate(store, token).name == "carol"
        listed = json.loads(cli("--list", "--json").stdout)["tokens"]
        assert [(t["name"], t["valid"]) for t in listed] == [("carol", True)] and token not in json.dumps(listed)
        assert cli("--revoke", "carol").returncode == 0
        with pytest.raises(auth.AuthError):
            auth.authenticate(store, token)
        assert cli("--revoke", "carol").returncode != 0
        actions = [(e.action, e.outcome.split(":")[0], e.via) for e in store.audit()]
        assert actions == [
            ("token.revoke", "failed", "cli"), ("token.revoke", "ok", "cli"), ("token.issue", "ok", "cli")
        ]  # fmt: skip
        listed = subprocess.run([sys.executable, "-m", "edgefleet", "control", "audit", "--store", store_url, "--json",
                                 "--limit", "2"], capture_output=True, text=True, timeout=60)  # fmt: skip
        entries = json.loads(listed.stdout)["entries"]
        assert [(e["action"], e["target"]) for e in entries] == [("token.revoke", "carol"), ("token.revoke", "carol")]
        assert entries[0]["actor"].startswith("cli:") and entries[0]["outcome"].startswith("failed: no live token")
    finally:
        store.close()


def test_logging_out_clears_the_cookie_and_needs_the_csrf_token(server: DashboardServer, store: Store) -> None:
    cookie, csrf = login(server, auth.issue_token(store, "alice"))
    same = {"Cookie": cookie, "Origin": origin(server)}
    assert request(server, "POST", "/logout", b"", same)[0] == 403
    status, headers, _ = request(server, "POST", "/logout", b"", {**same, auth.CSRF_HEADER: csrf})
    assert status == 303 and headers["location"] == "/login"
    assert headers["set-cookie"].startswith(f"{auth.COOKIE}=;") and "Max-Age=0" in headers["set-cookie"]


def test_control_serve_warns_loudly_when_bound_beyond_loopback(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "edgefleet", "control", "serve", "--broker", "mqtt://127.0.0.1:1", "--store",
         f"sqlite://{tmp_path}/s.sqlite", "--http", "0.0.0.0:0"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "WARNING: the dashboard listens on 0.0.0.0:0" in result.stderr and "!!!!!!!!" in result.stderr
    assert result.returncode != 0  # and then it could not reach the broker


def test_over_https_the_cookie_is_secure_and_plain_http_gets_nowhere(store: Store, tmp_path: Path) -> None:
    import ssl
    import urllib.error
    import urllib.request

    from edgefleet.control.credentials.pki import create_ca, create_server_cert

    ca = create_ca(tmp_path / "pki")
    cert = create_server_cert(tmp_path / "pki", ["127.0.0.1"])
    server = DashboardServer(store, "127.0.0.1", 0, tls=(str(cert.cert), str(cert.key))).start()
    try:
        assert server.url.startswith("https://127.0.0.1:")
        context = ssl.create_default_context(cafile=str(ca.cert))
        token = auth.issue_token(store, "alice")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(server.url + "api/fleet", timeout=10, context=context)
        assert refused.value.code == 401
        signed = urllib.request.Request(server.url + "api/fleet", headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(signed, timeout=10, context=context) as response:
            assert json.load(response)["devices"][0]["device_id"] == "dev-1"
        form = urllib.request.Request(server.url + "login", data=f"token={token}".encode(), headers={
            "Origin": server.url.rstrip("/"), "Content-Type": "application/x-www-form-urlencoded"})  # fmt: skip

        class Keep(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args: Any, **kwargs: Any) -> None:
                return None  # see the 303 itself

        opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context), Keep)
        with pytest.raises(urllib.error.HTTPError) as answer:
            opener.open(form, timeout=10)
        assert answer.value.code == 303 and "; Secure" in answer.value.headers["Set-Cookie"]
        plain = server.url.replace("https://", "http://")
        with pytest.raises((urllib.error.URLError, ConnectionError, http.client.HTTPException)):
            urllib.request.urlopen(plain + "api/fleet", timeout=10)
    finally:
        server.stop()
    warning = auth.bind_warning("0.0.0.0", 1, tls=True)
    assert warning is not None and "over TLS" in warning


def test_a_login_link_becomes_the_same_session_and_another_site_cannot_send_one(
    server: DashboardServer, store: Store
) -> None:
    """`edgefleet control token --login-url` prints /login?token=…: opened directly (a shell, a headless
    screenshot: no Sec-Fetch-Site, or "none") it sets the session cookie and lands on the page; sent from another
    site it is refused, so no page can log a visitor in under its own token."""
    token = auth.issue_token(store, "screenshot", ttl_s=600)
    status, headers, _ = request(server, "GET", f"/login?token={token}")
    assert status == 303 and headers["location"] == "/", (status, headers)
    cookie = headers["set-cookie"].split(";", 1)[0]
    assert "HttpOnly" in headers["set-cookie"] and "SameSite=Strict" in headers["set-cookie"]
    status, _, body = request(server, "GET", "/", headers={"Cookie": cookie})
    assert status == 200 and b"login" not in body.split(b"<title>", 1)[1].split(b"</title>", 1)[0]
    status, _, body = request(server, "GET", "/api/session", headers={"Cookie": cookie})
    assert status == 200 and json.loads(body)["user"] == "screenshot"

    status, headers, _ = request(server, "GET", "/login?token=eft_not-a-token")
    assert status == 303 and headers["location"] == "/login?failed=1"
    status, _, body = request(server, "GET", f"/login?token={token}", headers={"Sec-Fetch-Site": "cross-site"})
    assert status == 403 and "set-cookie" not in headers
    actions = [(e.action, e.outcome) for e in store.audit(limit=10)]
    assert ("login", "ok") in actions and ("login", "refused: cross-site link") in actions


def test_a_slots_class_is_set_through_the_dashboard_and_a_bad_one_is_refused_with_its_reason(
    server: DashboardServer, store: Store
) -> None:
    token = auth.issue_token(store, "alice")
    bearer = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def schedule(body: dict[str, object]) -> tuple[int, bytes]:
        status, _, answer = request(server, "POST", "/api/desired/schedule", json.dumps(body).encode(), bearer)
        return status, answer

    good = {"scope": "group", "target": "line", "slot": "detector", "slot_class": "real-time",
            "latency_objective_ms": 30}  # fmt: skip
    status, answer = schedule(good)
    assert status == 200 and json.loads(answer) == {**good, "latency_objective_ms": 30.0}
    for bad, why in (
        ({**good, "slot_class": "urgent"}, b"unknown slot class 'urgent'"),
        ({**good, "slot_class": "batch"}, b"a latency objective is a real-time slot's"),
        ({**good, "latency_objective_ms": "fast"}, b"must be a number"),
        ({**good, "latency_objective_ms": True}, b"must be a number"),
        ({**good, "slot": "../x"}, b"slot"),
    ):
        status, answer = schedule(bad)
        assert status == 400 and why in answer, (bad, status, answer)
    assert [(p.target, p.slot, p.slot_class, p.latency_objective_ms) for p in store.slot_policies()] == [
        ("line", "detector", "real-time", 30.0)
    ]
    trail = [(e.action, e.outcome.split(":")[0]) for e in reversed(store.audit()) if e.action == "desired.schedule"]
    assert trail[0] == ("desired.schedule", "ok") and len(trail) == 6
