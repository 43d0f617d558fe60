"""The dashboard: a small JSON API over the store and a static page that draws it (no CDN, no framework).

    GET /                         the page (edgefleet/control/web/index.html, app.js, style.css)
    GET /api/fleet                every device: status, labels, latest telemetry; ingestion counters
    GET /api/devices/ID/series    ?window=SECONDS&points=N: p50/p95 latency and golden agreement over time
    GET /api/rollouts             recent rollouts with their waves and per-state device counts
    GET /healthz                  "ok"

Read-only on purpose: it has no authentication, so it binds to 127.0.0.1 unless told otherwise, and
rollouts are started, paused and aborted with the command line.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from edgefleet.control.rollout import RolloutDoc
from edgefleet.control.rollout_engine import ENGINE_LEASE, load_doc
from edgefleet.control.store import Store
from edgefleet.core.topics import check_segment

log = logging.getLogger(__name__)

STATIC = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}


def api_fleet(store: Store, now: float | None = None) -> dict[str, Any]:
    now = time.time() if now is None else now
    latest = store.latest_telemetry()
    rows = []
    for d in store.devices():
        t = latest.get(d.device_id)
        rows.append(
            {
                "device_id": d.device_id, "online": d.online, "state": d.state, "profile": d.profile,
                "groups": list(d.groups), "labels": dict(d.labels), "bundle": d.active_bundle,
                "model": d.active_model, "provider": d.provider, "verified": d.verified, "last_error": d.last_error,
                "status_age_s": round(now - d.status_ts, 1),
                "p50_ms": t.p50_ms if t else None, "p95_ms": t.p95_ms if t else None,
                "golden_agreement": t.golden_agreement if t else None, "requests": t.requests if t else None,
                "errors": t.errors if t else None, "cpu_percent": t.cpu_percent if t else None,
                "rss_mb": t.rss_mb if t else None, "telemetry_age_s": round(now - t.ts, 1) if t else None,
            }
        )  # fmt: skip
    lease = store.lease(ENGINE_LEASE)
    return {
        "generated_at": now,
        "devices": rows,
        "counters": store.counters(),
        "engine": {"holder": lease[0], "alive": lease[1] > now} if lease else None,
    }


def api_series(store: Store, device_id: str, window_s: float, points: int, now: float | None = None) -> dict[str, Any]:
    now = time.time() if now is None else now
    window_s = min(max(window_s, 10.0), 90 * 86400.0)
    step = max(window_s / max(min(points, 2000), 10), 1.0)
    series = store.series(device_id, now - window_s, now + step, step)
    return {
        "device_id": device_id,
        "since": now - window_s,
        "until": now,
        "step": step,
        "points": [
            {
                "ts": p.ts, "p50_ms": p.p50_ms, "p95_ms": p.p95_ms, "golden_agreement": p.golden_agreement,
                "requests": p.requests, "errors": p.errors, "bundle": p.bundle_id,
            }
            for p in series
        ],
    }  # fmt: skip


def rollout_summary(doc: RolloutDoc) -> dict[str, Any]:
    waves = []
    for wave in doc.waves:
        counts: dict[str, int] = {}
        for device_id in wave.devices:
            state = doc.devices[device_id].state
            counts[state] = counts.get(state, 0) + 1
        waves.append(
            {"index": wave.index, "state": wave.state, "devices": len(wave.devices), "counts": counts,
             "verdict": wave.verdict}
        )  # fmt: skip
    return {
        "id": doc.id,
        "state": doc.state,
        "group": doc.spec.group,
        "bundles": [b.bundle_id for b in doc.spec.bundles],
        "created_at": doc.created_at,
        "updated_at": doc.updated_at,
        "current_wave": doc.current_wave,
        "waves": waves,
        "counts": doc.counts(),
        "outcome": doc.outcome,
        "log": [entry.model_dump() for entry in doc.log[-12:]],
        "failures": [
            {"device_id": d.device_id, "state": d.state, "reason": d.reason}
            for d in doc.devices.values()
            if d.state in ("failed", "timed-out", "rollback-timed-out")
        ],
    }


def api_rollouts(store: Store, limit: int = 20) -> dict[str, Any]:
    rows = store.rollouts()[-limit:]
    return {"rollouts": [rollout_summary(load_doc(row)) for row in reversed(rows)]}


class _Handler(BaseHTTPRequestHandler):
    server_version = "edgefleet-dashboard"
    store: Store  # set on the subclass made per server

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("dashboard: " + format, *args)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        parts = [p for p in url.path.split("/") if p]
        try:
            if not parts:
                self._static("index.html")
            elif parts == ["healthz"]:
                self._send(HTTPStatus.OK, b"ok\n", "text/plain; charset=utf-8")
            elif len(parts) == 2 and parts[0] == "static" and parts[1] in STATIC:
                self._static(parts[1])
            elif parts == ["api", "fleet"]:
                self._json(api_fleet(self.store))
            elif parts == ["api", "rollouts"]:
                self._json(api_rollouts(self.store))
            elif len(parts) == 4 and parts[:2] == ["api", "devices"] and parts[3] == "series":
                device_id = check_segment("device id", parts[2])
                window = float(query.get("window", ["900"])[0])
                points = int(query.get("points", ["240"])[0])
                self._json(api_series(self.store, device_id, window, points))
            else:
                self._json({"error": f"no such page: {url.path}"}, HTTPStatus.NOT_FOUND)
        except ValueError as err:
            self._json({"error": str(err)}, HTTPStatus.BAD_REQUEST)
        except Exception as err:  # a bad query or a busy store answers 500; the server goes on
            log.exception("dashboard request %s failed", self.path)
            self._json({"error": f"{type(err).__name__}: {err}"}, HTTPStatus.INTERNAL_SERVER_ERROR)

    def _static(self, name: str) -> None:
        body = resources.files("edgefleet.control").joinpath("web", name).read_bytes()
        self._send(HTTPStatus.OK, body, STATIC[name])

    def _json(self, value: Any, status: HTTPStatus = HTTPStatus.OK) -> None:
        self._send(status, json.dumps(value).encode(), "application/json")

    def _send(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)


class DashboardServer:
    """The HTTP server on its own thread; port 0 picks a free one (see `url`)."""

    def __init__(self, store: Store, host: str = "127.0.0.1", port: int = 8780) -> None:
        handler = type("Handler", (_Handler,), {"store": store})
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="dashboard", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host if isinstance(host, str) else host.decode()}:{port}/"

    def start(self) -> DashboardServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
