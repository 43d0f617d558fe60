"""Model quality on the device: field accuracy, drift, shadow models and probe traffic.

Other rooms use `Quality` (all of it, wired to serving in one place), its `QualityConfig` and command-line
options (`add_arguments`, `config_from`), and `FieldAccuracy` / `parse_labels` / `FeedbackError` (the local API's
feedback endpoint).
The monitor's names (`Quality`, `QualityConfig`, `ShadowProblem`, `add_arguments`, `config_from`) are imported when
first used: the local API needs only `FieldAccuracy`, and the monitor brings the transfer room (zstandard,
cryptography, tarfile) with it.
"""

from typing import TYPE_CHECKING

from edgefleet.agent.quality.feedback import FeedbackError, FieldAccuracy, parse_labels
from edgefleet.core.lazy import lazy_names

if TYPE_CHECKING:
    from edgefleet.agent.quality.monitor import Quality, QualityConfig, ShadowProblem, add_arguments, config_from

_LAZY = {  # imported when first used: not needed to serve (see the module's docstring)
    "Quality": "edgefleet.agent.quality.monitor",
    "QualityConfig": "edgefleet.agent.quality.monitor",
    "ShadowProblem": "edgefleet.agent.quality.monitor",
    "add_arguments": "edgefleet.agent.quality.monitor",
    "config_from": "edgefleet.agent.quality.monitor",
}

__all__ = [
    "FeedbackError",
    "FieldAccuracy",
    "Quality",
    "QualityConfig",
    "ShadowProblem",
    "add_arguments",
    "config_from",
    "parse_labels",
]


# The monitor on first use: the local API's feedback needs only FieldAccuracy, not shadows or probe uploads.
__getattr__ = lazy_names(__name__, _LAZY, globals())
