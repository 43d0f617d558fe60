"""Model quality on the device: field accuracy, drift, shadow models and probe traffic.

Other rooms use `Quality` (all of it, wired to serving in one place), its `QualityConfig` and command-line
options (`add_arguments`, `config_from`), and `FieldAccuracy` / `parse_labels` / `FeedbackError` (the local API's
feedback endpoint).
"""

from edgefleet.agent.quality.feedback import FeedbackError, FieldAccuracy, parse_labels
from edgefleet.agent.quality.monitor import Quality, QualityConfig, ShadowProblem, add_arguments, config_from

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
