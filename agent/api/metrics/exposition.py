"""The Prometheus text exposition format 0.0.4 and OpenMetrics 1.0, written directly.

The agent used prometheus_client for this; importing it costs a scraped device about 3.4 MB of memory for good,
for a page of a few fixed metric families. This module writes the same page, byte for byte (the tests render the
same metrics with prometheus_client and compare): metric families of type counter, gauge, histogram and info;
counters as `_total` with a `_created` series (in the 0.0.4 format a separate `<name>_created` gauge family, as
prometheus_client writes it; in OpenMetrics beside each series); info as `<name>_info`; label names sorted; label
values and help texts escaped; floats as Go writes them. `negotiate` picks the format from the scraper's Accept
header as prometheus_client's `choose_encoder` does. Metric and label names must be valid legacy Prometheus names
(the agent's are constants): of the name escaping schemes a scraper may ask for, only `dots` changes them (each
`_` doubled).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import NamedTuple

TEXT_0_0_4 = "text/plain; version=0.0.4; charset=utf-8"
TEXT_1_0_0 = "text/plain; version=1.0.0; charset=utf-8"
OPENMETRICS_1_0_0 = "application/openmetrics-text; version=1.0.0; charset=utf-8"
ESCAPINGS = ("allow-utf-8", "underscores", "dots", "values")


class Sample(NamedTuple):
    suffix: str  # "", "_total", "_created", "_bucket", "_count", "_sum", "_info"
    labels: Mapping[str, str]
    value: float


class Family:
    """One metric family: its base name (a counter's without `_total`), type, help and samples in order.
    (Plain classes: a dataclass costs a scraped device more memory than this whole module.)"""

    __slots__ = ("help", "name", "samples", "type")

    def __init__(self, name: str, kind: str, help_text: str) -> None:
        self.name, self.type, self.help = name, kind, help_text  # kind: counter, gauge, histogram or info
        self.samples: list[Sample] = []

    def add(self, suffix: str, labels: Mapping[str, str], value: float) -> None:
        self.samples.append(Sample(suffix, labels, value))


def counter(name: str, help_text: str) -> Family:
    return Family(name.removesuffix("_total"), "counter", help_text)


def count(family: Family, labels: Mapping[str, str], value: float, created: float | None = None) -> None:
    family.add("_total", labels, value)
    if created is not None:
        family.add("_created", labels, created)


def gauge(name: str, help_text: str, value: float | None = None) -> Family:
    family = Family(name, "gauge", help_text)
    if value is not None:
        family.add("", {}, value)
    return family


def go_float(value: float) -> str:
    """A float as Go's strconv writes it (what Prometheus' own clients write): +Inf, -Inf, NaN, exponents from 1e7."""
    value = float(value)
    if value == math.inf:
        return "+Inf"
    if value == -math.inf:
        return "-Inf"
    if math.isnan(value):
        return "NaN"
    text = repr(value)
    dot = text.find(".")
    if value > 0 and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


def _label_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _name(name: str, escaping: str) -> str:
    """A valid legacy metric or label name under the scraper's escaping scheme."""
    return name.replace("_", "__") if escaping == "dots" else name


def _line(name: str, labels: Mapping[str, str], value: float, escaping: str) -> str:
    if not labels:
        return f"{_name(name, escaping)} {go_float(value)}\n"
    pairs = ",".join(f'{_name(key, escaping)}="{_label_value(labels[key])}"' for key in sorted(labels))
    return f"{_name(name, escaping)}{{{pairs}}} {go_float(value)}\n"


def render_text(families: Iterable[Family], escaping: str = "underscores") -> bytes:
    """The Prometheus text format 0.0.4 (also served as 1.0.0: the same lines)."""
    out: list[str] = []
    for family in families:
        name, kind = family.name, family.type
        if kind == "counter":
            name = f"{name}_total"
        elif kind == "info":
            name, kind = f"{name}_info", "gauge"
        help_text = family.help.replace("\\", r"\\").replace("\n", r"\n")
        out += [f"# HELP {_name(name, escaping)} {help_text}\n", f"# TYPE {_name(name, escaping)} {kind}\n"]
        created = [s for s in family.samples if s.suffix == "_created"]
        out += [
            _line(family.name + s.suffix, s.labels, s.value, escaping) for s in family.samples if s.suffix != "_created"
        ]
        if created:
            name = _name(f"{family.name}_created", escaping)
            out += [f"# HELP {name} {help_text}\n", f"# TYPE {name} gauge\n"]
            out += [_line(f"{family.name}_created", s.labels, s.value, escaping) for s in created]
    return "".join(out).encode()


def render_openmetrics(families: Iterable[Family], escaping: str = "underscores") -> bytes:
    """OpenMetrics 1.0 text: base names in the metadata, every sample in its family, `# EOF` last."""
    out: list[str] = []
    for family in families:
        name, help_text = _name(family.name, escaping), _label_value(family.help)
        out += [f"# HELP {name} {help_text}\n", f"# TYPE {name} {family.type}\n"]
        out += [_line(family.name + s.suffix, s.labels, s.value, escaping) for s in family.samples]
    out.append("# EOF\n")
    return "".join(out).encode()


def _parameter(tokens: list[str], key: str) -> str:
    for token in tokens:
        if "=" in token:
            name, value = token.strip().split("=", 1)
            if name == key:
                return value
    return ""


def _version_at_least_1(version: str) -> bool:
    parts: list[int | str] = []
    for part in version.split("."):
        try:
            parts.append(int(part))
        except ValueError:
            parts.append(part)
    try:
        return tuple(parts) >= (1, 0, 0)
    except TypeError:  # a non-numeric part compared with a number
        return False


def negotiate(accept: str) -> tuple[bool, str, str]:
    """(OpenMetrics?, content type, name escaping) for the scraper's Accept header, as prometheus_client chooses."""
    for accepted in (accept or "").split(","):
        tokens = accepted.split(";")
        media = tokens[0].strip()
        if media not in ("application/openmetrics-text", "text/plain"):
            continue
        version = _parameter(tokens, "version")
        escaping = _parameter(tokens, "escaping")
        escaping = escaping if escaping in ESCAPINGS else "underscores"
        if media == "application/openmetrics-text" and not version:
            return True, OPENMETRICS_1_0_0, "underscores"
        if version and _version_at_least_1(version):
            if media == "application/openmetrics-text":
                content_type = f"application/openmetrics-text; version={version}; charset=utf-8; escaping={escaping}"
                return True, content_type, escaping
            return False, f"{TEXT_1_0_0}; escaping={escaping}", escaping
    return False, TEXT_0_0_4, "underscores"
