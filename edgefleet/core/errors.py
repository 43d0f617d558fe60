"""One small error hierarchy. Every error is a user-facing sentence; causes are always chained."""

from __future__ import annotations

from collections.abc import Iterable


class EdgefleetError(Exception):
    """Base class: the command line prints `str(err)` as one line and exits non-zero."""


class UserInputError(EdgefleetError):
    """The user gave us something we cannot use (a path, a name, a file of the wrong kind)."""


class ModelError(UserInputError):
    """The model file is missing, corrupt or not ONNX."""


class DataError(UserInputError):
    """Calibration or evaluation data does not fit the model."""


class UnknownNameError(UserInputError):
    """A name that does not exist; the message lists the ones that do."""

    def __init__(self, kind: str, name: str, valid: Iterable[str]) -> None:
        self.kind, self.name, self.valid = kind, name, sorted(valid)
        super().__init__(f"unknown {kind} {name!r}; valid: {', '.join(self.valid) or '(none)'}")


class BundleError(EdgefleetError):
    """A bundle is malformed, tampered with, or does not fit this device."""


class SignatureError(BundleError):
    """The signature does not verify against any trusted key."""


class ConversionError(EdgefleetError):
    """The converter could not produce any acceptable bundle."""


class BrokerError(EdgefleetError):
    """The MQTT broker cannot be reached or refused us."""


class DiskFullError(EdgefleetError):
    """The disk filled up while writing: transient, retried once space returns (never a corrupt bundle)."""
