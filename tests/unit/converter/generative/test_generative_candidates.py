"""Each generative target's candidates, declared: a pure function of (target, source, host), tested as tables."""

from __future__ import annotations

from dataclasses import replace

import pytest

from edgefleet.converter.generative.candidates import HostView, plan_target
from edgefleet.converter.generative.source import load_decoder
from edgefleet.core.profiles import GenerativeTarget

from support.paths import TINYLM

SOURCE = load_decoder(TINYLM / "model")
HERE = HostView(frozenset({"onnxruntime-genai:cpu", "openvino-genai:CPU"}), cpu_bf16=True)
ORT_CPU = GenerativeTarget(runtime="onnxruntime-genai", providers=["onnxruntime-genai:cpu"],
                           precisions=["int4-weights", "int8-weights", "fp16", "fp32"])  # fmt: skip
OV_CPU = GenerativeTarget(runtime="openvino-genai", providers=["openvino-genai:CPU"],
                          precisions=["int4-weights", "int8-weights", "bf16", "fp16", "fp32"])  # fmt: skip


def test_onnxruntime_genai_on_the_cpu() -> None:
    plan = plan_target(ORT_CPU, SOURCE, HERE)
    assert [(c.name, c.precision, c.build.method) for c in plan.candidates] == [
        ("ort-int4-rtn", "int4-weights", "ort-builder"),
        ("ort-int4-gptq", "int4-weights", "ort-gptq"),
        ("ort-int8", "int8-weights", "ort-builder"),
        ("ort-fp32", "fp32", "ort-builder"),
    ]
    gptq = plan.candidates[1].build
    assert gptq.base is not None and gptq.base.key == "ort-fp32" and "calibration" in gptq.needs
    assert plan.candidates[0].build.params == {"execution_provider": "cpu", "precision": "int4", "algo_config": "rtn",
                                               "block_size": 32}  # fmt: skip
    assert all(c.measurable and c.runtime_config == {} for c in plan.candidates)
    assert [c.order for c in plan.candidates] == [0, 0, 1, 3]
    ((skipped, reason),) = [(s.name, s.reason) for s in plan.skipped]
    assert skipped == "onnxruntime-genai fp16" and "first decode step" in reason


def test_openvino_genai_on_the_cpu_pins_what_it_was_judged_with() -> None:
    plan = plan_target(OV_CPU, SOURCE, HERE)
    by = {c.name: c for c in plan.candidates}
    assert list(by) == ["ov-int4", "ov-int4-awq", "ov-int8", "ov-bf16", "ov-fp32"]
    assert by["ov-fp32"].runtime_config == {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32",
                                            "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}  # fmt: skip
    assert by["ov-bf16"].runtime_config["INFERENCE_PRECISION_HINT"] == "bf16"
    assert by["ov-bf16"].build == by["ov-fp32"].build  # one IR, two hints
    assert by["ov-int4-awq"].build.params["awq"] is True and by["ov-int4"].build.params["group_size"] == 32
    assert by["ov-int8"].runtime_config["DYNAMIC_QUANTIZATION_GROUP_SIZE"] == 32
    assert [s.name for s in plan.skipped] == ["openvino-genai fp16"]


def test_bf16_is_left_out_where_the_cpu_does_not_compute_it() -> None:
    plan = plan_target(OV_CPU, SOURCE, replace(HERE, cpu_bf16=False))
    assert "ov-bf16" not in {c.name for c in plan.candidates}
    assert any("does not compute bf16" in s.reason for s in plan.skipped)


def test_a_device_this_host_lacks_is_built_and_judged_but_not_timed() -> None:
    cuda = GenerativeTarget(runtime="onnxruntime-genai", providers=["onnxruntime-genai:cuda"],
                            precisions=["int4-weights", "fp16"])  # fmt: skip
    plan = plan_target(cuda, SOURCE, HERE)
    assert [c.name for c in plan.candidates] == ["ort-cuda-int4-rtn", "ort-cuda-fp16"]
    assert not any(c.measurable for c in plan.candidates)
    assert plan.candidates[1].build.params["execution_provider"] == "cuda"
    assert "not on this host" in plan.notes[0] and "not timed" in plan.notes[0]
    gpu = GenerativeTarget(runtime="openvino-genai", providers=["openvino-genai:GPU"], precisions=["fp16"])
    (fp16,) = plan_target(gpu, SOURCE, HERE).candidates
    assert (fp16.name, fp16.build.params["weights"], fp16.measurable) == ("ov-gpu-fp16", "f16", False)


def test_a_host_that_is_not_the_profiles_hardware_times_nothing() -> None:
    elsewhere = replace(HERE, is_profile_hardware=False, not_profile_reason="this host is not rpi5-arm64")
    plan = plan_target(ORT_CPU, SOURCE, elsewhere)
    assert plan.candidates and not any(c.measurable for c in plan.candidates)
    assert "this host is not rpi5-arm64" in plan.notes[0]


@pytest.mark.parametrize("model_type", ["qwen3", "phi3"])
def test_openvino_refuses_other_families_with_the_reason(model_type: str) -> None:
    plan = plan_target(OV_CPU, replace(SOURCE, model_type=model_type), HERE)
    assert not plan.candidates and len(plan.skipped) == len(OV_CPU.precisions)
    assert all("Llama-style" in s.reason for s in plan.skipped)


def test_an_exported_genai_model_is_kept_and_quantized_by_post_passes() -> None:
    exported = replace(SOURCE, kind="onnx-genai", onnx_file="model.onnx")
    plan = plan_target(ORT_CPU, exported, HERE)
    assert [(c.name, c.build.method) for c in plan.candidates] == [
        ("ort-int4-rtn", "ort-nbits"), ("ort-int4-gptq", "ort-gptq"), ("ort-int8", "ort-nbits"),
        ("ort-as-is", "ort-as-is"),
    ]  # fmt: skip
    arrived_int4 = replace(exported, arrived_precision="int4-weights")
    plan = plan_target(ORT_CPU, arrived_int4, HERE)
    assert [c.name for c in plan.candidates] == ["ort-as-is"]
    assert all("not quantized again" in s.reason for s in plan.skipped if "fp16" not in s.name)
