"""Who may call the local API, decided from a request's head before anything else (agent/api/routes.py).

- `Host` must name this agent (DNS rebinding: a page on attacker.example that resolves to 127.0.0.1 sends its own
  name): the listen address, `localhost`, `127.0.0.1` or `[::1]` (any port: the origin check below covers other
  local pages), or a name the operator adds (`ServiceConfig.allowed_hosts`, `--http-allowed-host`). A request
  without `Host` (HTTP/1.0 tools) passes: a browser always sends one. On a Unix socket, which no browser reaches,
  `Host` is not checked.
- A browser's cross-origin request is refused: an `Origin` that is not one of the agent's own (`http://` a served
  host and port; `null` included), or `Sec-Fetch-Site: cross-site` / `same-site`. Every POST is state-changing or
  costly (inference, generation, feedback), so a POST whose `Content-Type` is one a page may send without a CORS
  preflight (`text/plain`, `application/x-www-form-urlencoded`, `multipart/form-data`) is refused too (415): no
  "simple" no-cors request reaches a model, even from a browser that sends no `Origin`. JSON
  (`application/json`), the OIP binary extension (`application/octet-stream` with `Inference-Header-Content-Length`),
  `.npy`/`.npz`, or no `Content-Type` at all (curl without `-d`, Python's http.client, tritonclient) are taken.
- With a token (`ServiceConfig.api_token`, `--api-token-file`), every request must carry
  `Authorization: Bearer TOKEN` (what the `openai` client sends as its `api_key`), else 401: required wherever the
  API listens beyond loopback.
"""

from __future__ import annotations

import hmac
import ipaddress

from edgefleet.agent.api.config import ServiceConfig
from edgefleet.agent.api.errors import RequestError
from edgefleet.agent.api.http.protocol import Head

SIMPLE_TYPES = ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data")  # no CORS preflight
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


def _bracketed(host: str) -> str:
    try:
        return f"[{host}]" if ipaddress.ip_address(host).version == 6 else host
    except ValueError:
        return host


def _name(host: str) -> str:
    """The name part of a Host value (`name`, `name:port`, `[v6]`, `[v6]:port`), lower-case."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    return host.rpartition(":")[0] if ":" in host else host


class Callers:
    def __init__(self, config: ServiceConfig, port: int) -> None:
        """`port`: the port served (for the agent's own origins)."""
        self._token = config.api_token.encode() if config.api_token else None
        self._check_host = config.unix_socket is None
        self.names = frozenset(_name(n) for n in (*LOOPBACK_NAMES, _bracketed(config.host), *config.allowed_hosts))
        self.origins = frozenset(f"{scheme}://{name}{suffix}" for scheme in ("http", "https") for name in self.names
                                 for suffix in (f":{port}", "" if port in (80, 443) else f":{port}"))  # fmt: skip

    def check(self, head: Head) -> None:
        """RequestError (401, 403, 415) when this request may not be served; None when it may."""
        headers = head.headers
        if self._token is not None:
            scheme, _, given = headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self._token):
                raise RequestError(401, "unauthorized", "this agent's local API needs its token: "
                                   "send Authorization: Bearer TOKEN")  # fmt: skip
        host = headers.get("host")
        if self._check_host and host is not None and _name(host) not in self.names:
            raise RequestError(403, "forbidden", f"Host {host[:64]!r} is not a name this agent serves "
                               "(add it with --http-allowed-host)")  # fmt: skip
        origin = headers.get("origin")
        if origin is not None and origin.lower() not in self.origins:
            raise RequestError(403, "forbidden", f"requests from the web origin {origin[:64]!r} are refused")
        if headers.get("sec-fetch-site", "same-origin").lower() in ("cross-site", "same-site"):
            raise RequestError(403, "forbidden", "cross-site requests from a browser are refused")
        if head.method == "POST":
            media = headers.get("content-type", "").split(";")[0].strip().lower()
            if media in SIMPLE_TYPES:
                message = f"Content-Type {media} is not accepted (a browser may send it cross-origin): send "
                raise RequestError(415, "bad-request", message + "application/json, the OIP binary type, .npy, .npz")


__all__ = ["LOOPBACK_NAMES", "SIMPLE_TYPES", "Callers"]
