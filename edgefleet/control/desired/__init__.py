"""Desired state: resolved per device and published as signed, counted, expiring documents."""
