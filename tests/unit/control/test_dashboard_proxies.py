"""Whose address a dashboard request comes from (control/dashboard/auth.py `client_address`): the TCP peer's,
unless the peer is a proxy the operator named with `--trusted-proxy` (issue 32, item 7)."""

from __future__ import annotations

import pytest

from edgefleet.control.dashboard.auth import client_address, trusted_proxies
from edgefleet.core.errors import UserInputError

PROXIES = trusted_proxies(["10.0.0.7", "fd00::/64"])


@pytest.mark.parametrize(
    ("peer", "forwarded", "proxies", "expected"),
    [
        ("127.0.0.1", "203.0.113.9", (), "127.0.0.1"),  # no proxy named: the header is anyone's to write
        ("192.0.2.1", "203.0.113.9", PROXIES, "192.0.2.1"),  # the peer is not a named proxy
        ("10.0.0.7", "203.0.113.9", PROXIES, "203.0.113.9"),  # the named proxy says who its client is
        ("10.0.0.7", "6.6.6.6, 203.0.113.9", PROXIES, "203.0.113.9"),  # what the client wrote is on the left
        ("fd00::2", "203.0.113.9, 10.0.0.7", PROXIES, "203.0.113.9"),  # a chain of named proxies is skipped
        ("10.0.0.7", None, PROXIES, "10.0.0.7"),
    ],
)
def test_x_forwarded_for_is_believed_only_from_a_named_proxy(
    peer: str, forwarded: str | None, proxies: tuple, expected: str
) -> None:
    assert client_address(peer, forwarded, proxies) == expected


def test_a_trusted_proxy_that_is_not_an_address_is_a_clear_error() -> None:
    with pytest.raises(UserInputError, match="not an IP address"):
        trusted_proxies(["proxy.example"])
