"""The conversion report beside the bundles: a JSON document, an HTML page and a latency-vs-accuracy plot per
profile, read from the conversion's results only."""

from edgefleet.converter.report.document import write_report

__all__ = ["write_report"]
