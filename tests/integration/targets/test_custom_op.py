"""Custom operators end to end, with the worked example in models/custom_op (edgefleet.ops::Swish exported from
torch with register_custom_op_symbolic): the converter records custom domains with versions, decomposes known
ops where a target cannot host them (gated), says which targets cannot take them; the agent runs them through
onnxruntime-extensions or a compiled library the bundle names, and refuses, before download, a bundle whose
custom ops it lacks, naming them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from edgefleet.agent.install.installer import Refused, check_runnable
from edgefleet.agent.runtime import custom_ops as agent_ops
from edgefleet.agent.runtime.backends import CancelToken, LoadOptions, backend_for
from edgefleet.control.fleet.remote import RemoteModel
from edgefleet.converter import ConvertRequest, convert
from edgefleet.converter.passes import custom_ops as cops
from edgefleet.converter.runners import ort_runner
from edgefleet.core.bundle.archive import parse_manifest, read_signed_manifest
from edgefleet.core.bundle.manifest import CustomOp, Manifest
from edgefleet.core.errors import ConversionError
from edgefleet.core.mqtt.connection import Connection
from edgefleet.core.profiles import get_profile
from edgefleet.core.topics import Topics
from edgefleet.core.trust.signing import SigningKey

from support.fleet import AgentProcess, FleetWatcher, deploy_to
from support.paths import DIGITS
from support.slots import slot_of

EXAMPLE = DIGITS.parent / "custom_op"
PACKAGE = EXAMPLE / "swish_op.py"
MODEL = EXAMPLE / "swish_cnn.onnx"
SWISH = "edgefleet.ops::Swish"


@pytest.fixture
def with_package(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(cops.ENV_VAR, str(PACKAGE))
    yield


@pytest.fixture(scope="module")
def swish_bundles(tmp_path_factory: pytest.TempPathFactory, signing_key: SigningKey) -> dict[str, Path]:
    """generic-x86-64 bundles of the example: custom op kept (policy host) and decomposed (policy decompose)."""
    out = tmp_path_factory.mktemp("swish")
    found = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(cops.ENV_VAR, str(PACKAGE))
        for policy in ("host", "decompose"):
            (result,) = convert(
                ConvertRequest(
                    model=MODEL, profiles=[get_profile("generic-x86-64")], calib=DIGITS / "calib.npz",
                    eval=DIGITS / "eval.npz", out=out / policy, key=signing_key, name="swish-cnn", version="1",
                    report=False, custom_ops=policy,  # type: ignore[arg-type]
                )
            )  # fmt: skip
            assert result.bundle, result.error
            found[policy] = Path(result.bundle)
    return found


def _manifest(bundle: Path) -> Manifest:
    return parse_manifest(read_signed_manifest(bundle).manifest_json)


def _eval(count: int) -> tuple[np.ndarray, np.ndarray]:
    with np.load(DIGITS / "eval.npz") as data:
        return data["input"][:count], data["labels"][:count]


def test_the_example_model_holds_the_custom_op_in_its_own_domain() -> None:
    model = onnx.load(str(MODEL))
    assert {(n.domain, n.op_type) for n in model.graph.node if n.domain} == {("edgefleet.ops", "Swish")}
    assert {i.domain: i.version for i in model.opset_import}["edgefleet.ops"] == 1
    betas = {a.f for n in model.graph.node if n.op_type == "Swish" for a in n.attribute if a.name == "beta"}
    assert betas == {1.5}


def test_a_kept_custom_op_is_recorded_with_its_domain_version(swish_bundles: dict[str, Path]) -> None:
    manifest = _manifest(swish_bundles["host"])
    assert manifest.custom_op_domains == {"edgefleet.ops": 1}
    assert manifest.custom_ops == [CustomOp(domain="edgefleet.ops", op_type="Swish", version=1)]
    assert manifest.recipe.name == "ort-fp32" and manifest.accuracy.passed


def test_by_default_known_custom_ops_become_standard_ops_checked_by_the_accuracy_gate(
    swish_bundles: dict[str, Path],
) -> None:
    manifest = _manifest(swish_bundles["decompose"])
    assert manifest.custom_ops == [] and manifest.custom_op_domains == {}
    decomposed = {p.name: p.params for p in manifest.recipe.passes}["decompose-custom-ops"]
    assert decomposed["ops"] == [SWISH] and float(decomposed["sqnr_db"]) > 60  # type: ignore[arg-type]
    assert manifest.accuracy.passed and manifest.accuracy.value >= manifest.accuracy.reference - 0.01


def test_the_decomposition_computes_what_the_python_op_computes(with_package: None) -> None:
    images, _ = _eval(50)
    source = onnx.load(str(MODEL))
    with_op = ort_runner(source)
    standard = ort_runner(cops.decompose(source, cops.DecomposeConfig((SWISH,))))
    for image in images:
        np.testing.assert_allclose(with_op({"input": image})["logits"], standard({"input": image})["logits"], atol=1e-5)


def test_onnxruntime_contrib_ops_have_built_in_decompositions() -> None:
    nodes = [
        helper.make_node("Gelu", ["x"], ["a"], domain="com.microsoft"),
        helper.make_node("QuickGelu", ["a"], ["b"], domain="com.microsoft", alpha=1.5),
        helper.make_node("BiasGelu", ["b", "bias"], ["y"], domain="com.microsoft"),
    ]
    graph = helper.make_graph(
        nodes, "contrib", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor("bias", TensorProto.FLOAT, [4], [0.1, -0.2, 0.3, 0.0])],
    )  # fmt: skip
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    keys = tuple(op.key for op in cops.custom_ops(model))
    assert keys == ("com.microsoft::BiasGelu", "com.microsoft::Gelu", "com.microsoft::QuickGelu")
    standard = cops.decompose(model, cops.DecomposeConfig(keys))
    assert {n.domain for n in standard.graph.node} == {""}
    assert [i.domain for i in standard.opset_import] == [""]
    x = np.linspace(-3, 3, 8, dtype=np.float32).reshape(2, 4)
    native = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ours = ort.InferenceSession(standard.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(ours.run(None, {"x": x})[0], native.run(None, {"x": x})[0], atol=1e-5)


def test_policies_decide_per_target_and_say_why_a_target_is_blocked(with_package: None) -> None:
    ops = [CustomOp(domain="edgefleet.ops", op_type="Swish", version=1)]
    assert cops.plan(ops, "decompose", "onnxruntime", "onnx").decompose == (SWISH,)
    assert cops.plan(ops, "host", "onnxruntime", "onnx").keep == (SWISH,)
    assert cops.plan(ops, "host", "openvino", "openvino-ir").decompose == (SWISH,)
    blocked = cops.plan(ops, "keep", "onnxruntime-web", "onnx").blocked
    assert "onnxruntime-web (onnx) cannot load custom operators" in blocked[SWISH]
    unknown = [CustomOp(domain="acme", op_type="Mystery", version=2)]
    assert (
        "no standard-op decomposition is known"
        in cops.plan(unknown, "decompose", "coreml", "coreml").blocked["acme::Mystery"]
    )
    assert cops.plan(unknown, "decompose", "onnxruntime", "onnx-tensorrt").keep == ("acme::Mystery",)


def test_without_the_package_the_converter_says_what_to_install(tmp_path: Path, signing_key: SigningKey) -> None:
    with pytest.raises(ConversionError, match=r"edgefleet\.ops::Swish have no implementation on this host"):
        convert(
            ConvertRequest(
                model=MODEL, profiles=[get_profile("generic-x86-64")], calib=DIGITS / "calib.npz",
                eval=DIGITS / "eval.npz", out=tmp_path / "out", key=signing_key, name="swish", version="1",
            )
        )  # fmt: skip


def test_an_agent_without_the_implementation_refuses_naming_the_op(
    swish_bundles: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(agent_ops.ENV_VAR, raising=False)
    manifest = _manifest(swish_bundles["host"])
    with pytest.raises(Refused, match=r"custom operators this device lacks: edgefleet\.ops::Swish \(opset 1\)"):
        check_runnable(manifest)
    monkeypatch.setenv(agent_ops.ENV_VAR, str(PACKAGE))
    check_runnable(manifest)
    assert agent_ops.summary()[SWISH].startswith("python")


def test_a_compiled_library_named_by_the_bundle_is_found_and_registered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """onnxruntime-extensions' own shared library stands in for a compiled custom-op library (ai.onnx.contrib)."""
    import onnxruntime_extensions as extensions  # in the host extra: a missing install fails, never skips

    library = Path(extensions.get_library_path())
    op = CustomOp(domain="ai.onnx.contrib", op_type="Inverse", version=1, library=library.name)
    monkeypatch.delenv(agent_ops.LIBRARY_ENV_VAR, raising=False)
    assert "not in the custom-op library directories" in agent_ops.resolve([op]).missing[op.key]
    monkeypatch.setenv(agent_ops.LIBRARY_ENV_VAR, str(library.parent))
    resolved = agent_ops.resolve([op])
    assert resolved.ok and resolved.libraries == (library,)
    node = helper.make_node("Inverse", ["x"], ["y"], domain="ai.onnx.contrib")
    graph = helper.make_graph(
        [node], "inv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 3])],
    )  # fmt: skip
    path = tmp_path / "inverse.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(op.domain, 1)]),
              str(path))  # fmt: skip
    options = LoadOptions(threads=1, outputs=("y",), custom_op_libraries=(str(library),))
    session = backend_for("CPUExecutionProvider").load(path, "CPUExecutionProvider", options, CancelToken())
    matrix = np.array([[2, 0, 0], [0, 4, 0], [1, 0, 1]], np.float32)
    np.testing.assert_allclose(session.run({"x": matrix})["y"], np.linalg.inv(matrix), atol=1e-6)


def test_runtimes_that_cannot_host_custom_ops_are_not_offered_them() -> None:
    from edgefleet.agent.runtime.backends import availability

    assert not availability("openvino:CPU", "onnx", custom_ops=[SWISH]).ok
    assert "cannot load custom operators" in availability("openvino:CPU", "onnx", custom_ops=[SWISH]).reason
    assert availability("CPUExecutionProvider", "onnx", custom_ops=[SWISH]).ok


StartAgent = Callable[..., AgentProcess]


def test_the_custom_op_example_runs_end_to_end_on_an_agent(
    swish_bundles: dict[str, Path], start_agent: StartAgent, host: Connection, topics: Topics, watcher: FleetWatcher,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.delenv(agent_ops.ENV_VAR, raising=False)
    start_agent("dev-swish", profile="generic-x86-64", env={agent_ops.ENV_VAR: str(PACKAGE)})
    start_agent("dev-plain", profile="generic-x86-64")  # no custom-op package
    monkeypatch.setenv(agent_ops.ENV_VAR, str(PACKAGE))  # for the host-side reference below
    bundle_id = deploy_to(host, topics, swish_bundles["host"], devices=("dev-swish", "dev-plain"))
    status = watcher.serving("dev-swish", bundle_id, timeout=60)
    assert slot_of(status).provider_in_use == "CPUExecutionProvider"
    (loaded,) = status.native_code  # the device's own opt-in (a custom-op package): reported with what it loaded
    assert loaded.bundle_id == bundle_id and "onnxruntime-extensions" in loaded.origin and len(loaded.sha256) == 64

    images, labels = _eval(40)
    answers = RemoteModel(host, topics, "dev-swish").infer_many([{"input": image} for image in images])
    assert all(a.ok and a.bundle_id == bundle_id for a in answers), [a.error for a in answers if not a.ok]
    logits = np.concatenate([a.outputs["logits"].to_array() for a in answers])
    host_side = ort_runner(MODEL)  # the same op on the host, through the same package
    expected = np.concatenate([host_side({"input": image})["logits"] for image in images])
    np.testing.assert_allclose(logits, expected, atol=1e-4)
    assert np.mean(logits.argmax(axis=1) == labels) >= 0.9

    refused = watcher.event("dev-plain", "refused", bundle_id=bundle_id)
    assert "custom operators this device lacks: edgefleet.ops::Swish (opset 1)" in refused.detail
    assert watcher.status["dev-plain"].native_code == []
    assert not any(e.kind == "download-started" for e in watcher.events if e.device_id == "dev-plain")


def test_bundles_without_custom_ops_keep_the_manifest_older_agents_read(demo_bundles: dict[str, Path]) -> None:
    """custom_ops, tensorrt and web are left out of manifest.json when unused (older agents forbid extra keys)."""
    text = read_signed_manifest(demo_bundles["generic-x86-64"]).manifest_json
    assert '"custom_ops"' not in text and '"tensorrt"' not in text and '"web"' not in text
    # held-out judging: only mixed-precision bundles say which split judged them
    assert '"judged_on"' not in text and '"selection_samples"' not in text
    manifest = parse_manifest(text)
    assert manifest.custom_ops == [] and manifest.tensorrt is None and manifest.web is None
