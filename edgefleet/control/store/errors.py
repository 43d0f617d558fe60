"""The store's two errors: a store that cannot be opened or used, and a write refused because its lease term ended."""

from __future__ import annotations

from edgefleet.core.errors import EdgefleetError, UserInputError


class StoreError(UserInputError):
    """The store URL is wrong, or the store cannot be opened."""


class FencedOut(EdgefleetError):
    """A write made under a lease that another holder has since taken over: it was not made."""
