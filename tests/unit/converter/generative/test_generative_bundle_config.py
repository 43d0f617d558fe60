"""The converter never writes a bundle whose runtime configuration devices refuse (edgefleet/core/bundle/
runtime_config.py): a brought model folder whose genai_config.json names a custom-op library, or properties off the
allow-list, stop the conversion with the reason; what the model builder and the candidates write passes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgefleet.converter.generative.bundle import check_runtime_configuration
from edgefleet.converter.generative.candidates import OV_COMPRESSED
from edgefleet.core.errors import ConversionError
from edgefleet.core.profiles import GenerativeTarget

ORT = GenerativeTarget(runtime="onnxruntime-genai", providers=["onnxruntime-genai:cpu"], precisions=["fp32"])
OPENVINO = GenerativeTarget(runtime="openvino-genai", providers=["openvino-genai:CPU"], precisions=["int8-weights"])


def _folder(tmp_path: Path, session_options: dict[str, object]) -> Path:
    config = {"model": {"decoder": {"filename": "model.onnx", "session_options": session_options}, "type": "llama"}}
    (tmp_path / "genai_config.json").write_text(json.dumps(config))
    return tmp_path


def test_what_the_builder_and_the_candidates_write_passes(tmp_path: Path) -> None:
    check_runtime_configuration(_folder(tmp_path, {"log_id": "onnxruntime-genai", "provider_options": []}), {}, ORT)
    check_runtime_configuration(tmp_path, dict(OV_COMPRESSED), OPENVINO)


def test_a_brought_genai_config_naming_a_library_stops_the_conversion(tmp_path: Path) -> None:
    folder = _folder(tmp_path, {"custom_ops_library": "libmyops.so"})
    with pytest.raises(ConversionError, match=r"devices would refuse.*'custom_ops_library' loads a native library"):
        check_runtime_configuration(folder, {}, ORT)


def test_properties_off_the_allow_list_stop_the_conversion(tmp_path: Path) -> None:
    with pytest.raises(ConversionError, match="'CACHE_DIR' names a path"):
        check_runtime_configuration(tmp_path, {"CACHE_DIR": "/tmp/x"}, OPENVINO)
