"""Mixed precision for a quantized candidate that misses the task bar: keep in float only the layers that cost
the score (NNCF accuracy control, or the ORT exclusion search over layers ranked by local error), chosen on the
selection split and judged held out (converter.search.holdout)."""

from edgefleet.converter.search.mixed.float_set import FloatSearch, Trial, growth_counts, search_float_set
from edgefleet.converter.search.mixed.retry import mixed_attempts, ranked_layers

__all__ = ["FloatSearch", "Trial", "growth_counts", "mixed_attempts", "ranked_layers", "search_float_set"]
