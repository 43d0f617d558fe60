"""`edgefleet agent --batch-max-queue-delay-ms MS [--batch-preferred-size N] [--batch-instances N]` switches dynamic
batching on in the local API; without it nothing is batched; bad settings stop the agent with the setting's name."""

from __future__ import annotations

import argparse

import pytest
from pydantic import ValidationError

from edgefleet.cli.agent_cmd import _config, register

BASE = ["agent", "--broker", "mqtt://127.0.0.1:1883", "--device-id", "dev-1", "--state-dir", "/tmp/edgefleet-x"]


def _parse(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args([*BASE, *extra])


def test_batching_is_off_unless_its_delay_is_given() -> None:
    config = _config(_parse())
    assert config.http is not None and config.http.batching is None


def test_the_flags_set_the_local_apis_batching() -> None:
    config = _config(_parse("--batch-max-queue-delay-ms", "2", "--batch-preferred-size", "4", "--batch-instances", "2"))
    assert config.http is not None and config.http.batching is not None
    batching = config.http.batching
    assert (batching.max_queue_delay_ms, batching.preferred_batch_size, batching.instances) == (2.0, 4, 2)


def test_a_bad_setting_is_refused_with_its_name() -> None:
    with pytest.raises(ValidationError, match="preferred_batch_size"):  # cmd_agent words it as a UserInputError
        _config(_parse("--batch-max-queue-delay-ms", "1", "--batch-preferred-size", "1"))
