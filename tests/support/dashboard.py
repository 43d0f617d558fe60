"""The dashboard under test: headless Chromium, authenticated requests, a logged-in session."""

from __future__ import annotations

import shutil
import urllib.request
from typing import Any

from edgefleet.control.dashboard.auth import issue_token
from edgefleet.control.server import ControlPlane

CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run",
]  # fmt: skip


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        raise RuntimeError("Chromium is not installed: apt-get install -y chromium (the dashboard test needs it)")
    return path


def get(plane: ControlPlane, path: str) -> Any:
    assert plane.dashboard_url is not None
    token = issue_token(plane.store, "api-test")
    request = urllib.request.Request(plane.dashboard_url + path, headers={"Authorization": f"Bearer {token}"})
    return urllib.request.urlopen(request, timeout=5)


def log_in(page: Any, plane: ControlPlane) -> None:
    page.goto(plane.dashboard_url)
    page.fill("#token", issue_token(plane.store, "browser-test"))
    page.click("#login button[type=submit]")
