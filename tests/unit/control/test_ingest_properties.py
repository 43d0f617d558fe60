"""Property tests of ingest's parser and trust boundary (core/messages.py `decode`, control/fleet/admission.py):
whatever bytes a device publishes, parsing raises nothing but `MessageError`, admission nothing but
`AdmissionError`, and what is admitted carries no identifier outside its grammar and no text over its cap."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from edgefleet.control.fleet.admission import Admission, AdmissionError
from edgefleet.core.messages import SCHEMA_VERSION, DeviceStatus, Event, MessageError, Telemetry, decode
from edgefleet.core.topics import check_segment

KINDS = (DeviceStatus, Telemetry, Event)
LIMITS = Admission().limits

text = st.text(st.characters(codec="utf-8"), max_size=300) | st.sampled_from(["", "a/b", "x\n", "[/red]", "‮", "dev-1"])
scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | text
json_values: Any = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=6) | st.dictionaries(text, inner, max_size=6), max_leaves=40
)


def near_valid(kind: type[Any]) -> st.SearchStrategy[bytes]:
    """A message of `kind` with the right frame and arbitrary values: what a hostile device would try."""
    fields = {"schema_version": st.just(SCHEMA_VERSION), "device_id": st.just("dev-1") | text}
    for name in kind.model_fields:
        fields.setdefault(name, json_values)
    return st.fixed_dictionaries({}, optional=fields).map(lambda d: json.dumps(d, default=str).encode())


def check_admitted(message: Any) -> None:
    for value in (getattr(message, "bundle_id", None), getattr(message, "profile", None)):
        if value is not None:
            check_segment("identifier", value)
    for field in ("detail", "last_error"):
        value = getattr(message, field, None)
        assert value is None or len(value) <= LIMITS.max_text


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(KINDS), payload=st.binary(max_size=2000))
def test_arbitrary_bytes_raise_nothing_but_a_message_error(kind: type[Any], payload: bytes) -> None:
    try:
        message = decode(kind, payload)
    except MessageError:
        return
    with contextlib.suppress(AdmissionError):  # a refusal is an answer; anything else raised fails the test
        check_admitted(Admission().admit(message))


@settings(max_examples=300, deadline=None)
@given(data=st.data(), kind=st.sampled_from(KINDS))
def test_well_framed_hostile_messages_are_refused_or_admitted_within_the_rules(
    data: st.DataObject, kind: type[Any]
) -> None:
    payload = data.draw(near_valid(kind))
    try:
        message = decode(kind, payload)
    except MessageError:
        return
    try:
        admitted = Admission().admit(message)
    except AdmissionError:
        return
    check_admitted(admitted)
