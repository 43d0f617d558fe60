"""Who may call the local API (agent/api/callers.py), decided from a request's head: the Host names the agent (DNS
rebinding), a browser's cross-origin request and a "simple" POST a page could send without a preflight are
refused, and with a token every request carries it."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgefleet.agent.api.callers import Callers
from edgefleet.agent.api.config import ServiceConfig
from edgefleet.agent.api.errors import RequestError
from edgefleet.agent.api.http.protocol import Head

PORT = 8470
TOKEN = "s3cret-token-0123456789"


def head(method: str = "POST", **headers: str) -> Head:
    return Head(method, "/v1/completions", "", "HTTP/1.1", {k.replace("_", "-").lower(): v for k, v in headers.items()})


def refusal(callers: Callers, request: Head) -> int | None:
    try:
        callers.check(request)
    except RequestError as err:
        return err.status
    return None


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"host": f"127.0.0.1:{PORT}", "content_type": "application/json"}, None),
        ({"host": f"localhost:{PORT}"}, None),  # no Content-Type: http.client, tritonclient
        ({"host": f"[::1]:{PORT}", "content_type": "application/octet-stream"}, None),
        ({}, None),  # HTTP/1.0 tools send no Host; browsers always do
        ({"host": f"attacker.example:{PORT}"}, 403),  # DNS rebinding: the page's own name
        ({"host": "127.0.0.1.attacker.example"}, 403),
        ({"host": f"127.0.0.1:{PORT}", "origin": "http://attacker.example"}, 403),
        ({"host": f"127.0.0.1:{PORT}", "origin": "null"}, 403),  # a sandboxed frame, a data: page
        ({"host": f"127.0.0.1:{PORT}", "origin": "http://localhost:3000"}, 403),  # another local page
        ({"host": f"127.0.0.1:{PORT}", "origin": f"http://127.0.0.1:{PORT}"}, None),  # the agent's own origin
        ({"host": f"127.0.0.1:{PORT}", "sec_fetch_site": "cross-site"}, 403),
        ({"host": f"127.0.0.1:{PORT}", "content_type": "text/plain;charset=UTF-8"}, 415),  # fetch no-cors
        ({"host": f"127.0.0.1:{PORT}", "content_type": "application/x-www-form-urlencoded"}, 415),  # a form
        ({"host": f"127.0.0.1:{PORT}", "content_type": "multipart/form-data; boundary=x"}, 415),
    ],
)
def test_a_request_is_taken_only_from_a_caller_the_agent_serves(headers: dict[str, str], status: int | None) -> None:
    assert refusal(Callers(ServiceConfig(), PORT), head(**headers)) == status


def test_the_operator_adds_names_and_a_unix_socket_checks_no_host(tmp_path: Path) -> None:
    callers = Callers(ServiceConfig(allowed_hosts=("edge-7.lan",)), PORT)
    assert refusal(callers, head(host=f"edge-7.lan:{PORT}", origin=f"http://edge-7.lan:{PORT}")) is None
    assert refusal(callers, head(host="other.lan")) == 403
    assert refusal(Callers(ServiceConfig(unix_socket=tmp_path / "api.sock"), 0), head(host="anything")) is None


def test_with_a_token_every_request_carries_it() -> None:
    callers = Callers(ServiceConfig(host="0.0.0.0", api_token=TOKEN), PORT)
    assert refusal(callers, head("GET")) == 401
    assert refusal(callers, head("GET", authorization="Bearer wrong-token-0123456789")) == 401
    assert refusal(callers, head("GET", authorization=f"Basic {TOKEN}")) == 401
    assert refusal(callers, head("GET", authorization=f"Bearer {TOKEN}")) is None
    assert "s3cret" not in repr(ServiceConfig(api_token=TOKEN))
