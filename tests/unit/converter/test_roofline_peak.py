"""A limit is an upper bound (converter.roofline.peak): no share above 100 %, peaks that only ever rise (the best of
measurements, a busy cached figure measured again, a figure a bundle beat raised to what it achieved), and the CPU's
nominal rate from its ISA and clock, an estimate."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from edgefleet.converter.roofline import Artifact, MachineLimits, Work, judge, remember, roofline
from edgefleet.converter.roofline import limits as limits_module
from edgefleet.converter.roofline.peak import busy, merged_rates, nominal_fp32, raised_rates, share_pct
from edgefleet.converter.roofline.roofline import judged


@pytest.mark.parametrize(
    ("needed_s", "took_s", "pct"),
    [
        (0.5, 1.0, 50.0),  # half the time the limit allows
        (1.0, 1.0, 100.0),  # exactly at the limit
        (1.5, 1.0, 100.0),  # faster than the limit allows: still 100, never 150
        (0.0, 1.0, 0.0),
        (1.0, None, None),  # no latency measured: no share
        (1.0, 0.0, None),
    ],
)
def test_a_share_of_a_limit_is_never_above_100_percent(
    needed_s: float, took_s: float | None, pct: float | None
) -> None:
    assert share_pct(needed_s, took_s) == pct


@pytest.mark.parametrize(
    ("load", "cpus", "is_busy"),
    [
        (0.3, 2, False),
        (2.0, 2, False),  # every core busy, nothing waiting: the measurement had its cores
        (5.0, 2, True),  # the issue's case: a load average of 5 on a 2-core machine
        (2.5, 4, False),
        (0.9, None, False),  # unknown CPU count: read as one
        (1.1, None, True),
    ],
)
def test_a_figure_measured_at_a_load_above_the_cpu_count_was_measured_busy(
    load: float, cpus: int | None, is_busy: bool
) -> None:
    assert busy(load, cpus) is is_busy


@pytest.mark.parametrize(
    ("old", "new", "kept"),
    [
        ({"ort": {"fp32": 67.0}}, {"ort": {"fp32": 101.0}}, {"ort": {"fp32": 101.0}}),  # a better run raises
        ({"ort": {"fp32": 101.0}}, {"ort": {"fp32": 67.0}}, {"ort": {"fp32": 101.0}}),  # a busy run never lowers
        (
            {"ort": {"fp32": 1.0}},
            {"ort": {"int8": 4.0}, "ov": {"bf16": 2.0}},
            {"ort": {"fp32": 1.0, "int8": 4.0}, "ov": {"bf16": 2.0}},
        ),
    ],
)
def test_measured_figures_merge_by_their_maximum(old: dict, new: dict, kept: dict) -> None:
    assert merged_rates(old, new) == kept


@pytest.mark.parametrize(
    ("rates", "needed_s", "took_s", "raised", "factor"),
    [
        ({"fp32": 67.0}, 1.5, 1.0, {"fp32": 100.5}, 1.5),  # 1.5x faster than the peak allows: raised by 1.5
        ({"fp32": 67.0}, 0.5, 1.0, {"fp32": 67.0}, 1.0),  # inside the limit: unchanged
        ({"fp32": 10.0, "int8": 40.0}, 2.0, 1.0, {"fp32": 20.0, "int8": 80.0}, 2.0),  # both, by the same factor
        ({"fp32": 67.0}, 1.5, None, {"fp32": 67.0}, 1.0),  # no latency: nothing proven
    ],
)
def test_a_peak_a_bundle_beat_is_raised_just_enough_for_what_it_achieved(
    rates: dict, needed_s: float, took_s: float | None, raised: dict, factor: float
) -> None:
    got, got_factor = raised_rates(rates, needed_s, took_s)
    assert got == pytest.approx(raised) and got_factor == pytest.approx(factor)


def _limits(fp32: float = 67.0, bandwidth: float = 1000.0, **kw: object) -> MachineLimits:
    return MachineLimits(cpu="test", threads=1, gemm_gops={"onnxruntime": {"fp32": fp32}}, bandwidth_gbs=bandwidth,
                         measured_at="t0", seconds=0.0, key="k", **kw)  # type: ignore[arg-type]  # fmt: skip


DIGITS_LIKE = Work(macs={"Conv": 50_500_000}, macs_by_precision={"fp32": 50_500_000})  # 101 MFLOP a run


def test_the_issues_case_a_bundle_at_101_gflops_against_a_67_gflops_peak_is_at_100_percent_of_a_raised_peak() -> None:
    line = roofline(DIGITS_LIKE, "onnxruntime", _limits(67.0), latency_ms=1.0, name="digits fp32")
    assert line.achieved_gops == pytest.approx(101.0)
    assert line.limit_pct == pytest.approx(100.0) and line.compute_pct == pytest.approx(100.0)
    assert line.peaks_gops == {"fp32": pytest.approx(101.0)}
    assert line.raised == ["onnxruntime fp32 GOP/s raised from 67 to 101: digits fp32 achieved it"]
    inside = roofline(DIGITS_LIKE, "onnxruntime", _limits(202.0), latency_ms=1.0)
    assert inside.limit_pct == pytest.approx(50.0) and inside.raised == []


def test_bytes_moved_faster_than_the_measured_bandwidth_raise_the_bandwidth() -> None:
    work = Work(macs={}, macs_by_precision={}, weight_bytes=30_000_000)
    line = roofline(work, "onnxruntime", _limits(bandwidth=10.0), latency_ms=1.0)  # 30 GB/s achieved
    assert line.bound == "memory" and line.bandwidth_pct == pytest.approx(100.0)
    assert line.bandwidth_gbs == pytest.approx(30.0) and "bandwidth GB/s raised from 10 to 30" in line.raised[0]


def test_all_candidates_are_judged_against_the_same_peaks_raised_by_the_fastest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from edgefleet.converter.roofline import candidates

    monkeypatch.setattr(candidates, "work_of", lambda artifact, feeds: DIGITS_LIKE)
    artifacts = [Artifact("slow", "onnxruntime", Path("x.onnx"), 4.0), Artifact("fast", "onnxruntime",
                 Path("x.onnx"), 0.5)]  # fmt: skip
    lines, raised = judge(artifacts, {}, _limits(67.0))
    assert raised is not None and raised.gemm_gops["onnxruntime"]["fp32"] == pytest.approx(202.0)
    assert lines["fast"]["limit_pct"] == pytest.approx(100.0) and lines["fast"]["raised"]
    assert lines["slow"]["limit_pct"] == pytest.approx(12.5) and lines["slow"]["raised"] == []
    assert raised.raised == lines["fast"]["raised"]


@pytest.fixture
def fresh_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits_module, "_MEMO", {})
    monkeypatch.setattr(limits_module, "_REMEASURED", set())
    monkeypatch.setattr(limits_module, "machine_key", lambda threads: ("k", "test"))


@pytest.mark.parametrize(
    ("cached_load", "measured_again"),
    [(0.4, False), (5.0, True)],  # a quiet cached figure is used; one cached at load 5 on 2 cores is not
)
def test_a_cached_figure_measured_busy_is_measured_again_and_merged_never_lowered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_cache: None, cached_load: float, measured_again: bool
) -> None:
    remember(_limits(67.0, load_average=cached_load, cpus=2), tmp_path)
    monkeypatch.setattr(limits_module, "_MEMO", {})  # a new process: only the file is left
    calls: list[int] = []

    def measure(threads: int, key: str = "", cpu: str = "") -> MachineLimits:
        calls.append(threads)
        return replace(_limits(90.0, bandwidth=500.0, load_average=0.5, cpus=2), measured_at="t1")

    monkeypatch.setattr(limits_module, "measure", measure)
    found = limits_module.machine_limits(1, tmp_path)
    assert bool(calls) is measured_again
    if measured_again:  # the better fp32 figure is kept; the bandwidth the new run measured lower is not lowered
        assert found.gemm_gops["onnxruntime"]["fp32"] == 90.0 and found.bandwidth_gbs == 1000.0
        assert found.measurements == 2 and not found.busy()
        stored = json.loads((tmp_path / "machine-limits" / "k.json").read_text())
        assert stored["gemm_gops"]["onnxruntime"]["fp32"] == 90.0 and stored["load_average"] == 0.5
    else:
        assert found.gemm_gops["onnxruntime"]["fp32"] == 67.0


def test_a_busy_figure_is_measured_again_once_per_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_cache: None
) -> None:
    calls: list[int] = []

    def measure(threads: int, key: str = "", cpu: str = "") -> MachineLimits:  # a machine that stays busy
        calls.append(threads)
        return replace(_limits(60.0 + len(calls), load_average=5.0, cpus=2), measured_at=f"t{len(calls)}")

    monkeypatch.setattr(limits_module, "measure", measure)
    first = limits_module.machine_limits(1, tmp_path)
    again = limits_module.machine_limits(1, tmp_path)
    assert calls == [1] and again == first and first.busy()
    monkeypatch.setattr(limits_module, "_MEMO", {})
    monkeypatch.setattr(limits_module, "_REMEASURED", set())  # the next process measures again, and merges
    assert limits_module.machine_limits(1, tmp_path).gemm_gops["onnxruntime"]["fp32"] == 62.0 and calls == [1, 1]


def test_a_raised_peak_is_kept_for_the_next_judgement(tmp_path: Path, fresh_cache: None) -> None:
    kept = remember(_limits(67.0, load_average=0.1, cpus=2), tmp_path)
    line, raises = judged(DIGITS_LIKE, "onnxruntime", kept, 1.0, "digits fp32")
    remember(kept.raised_to(raises), tmp_path)
    limits_module._MEMO.clear()
    again = limits_module.machine_limits(1, tmp_path)
    assert again.gemm_gops["onnxruntime"]["fp32"] == pytest.approx(101.0) and again.measurements == 1
    assert again.raised == line.raised


XEON = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model name\t: Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz
cpu MHz\t\t: 2900.000
flags\t\t: fpu sse2 avx fma avx2 avx512f avx512_vnni
"""
ZEN4 = """vendor_id\t: AuthenticAMD
cpu family\t: 25
model name\t: AMD EPYC 9R14
cpu MHz\t\t: 2600.000
flags\t\t: sse2 avx fma avx2 avx512f avx512_bf16
"""
ZEN2 = """vendor_id\t: AuthenticAMD
cpu family\t: 23
model name\t: AMD EPYC
cpu MHz\t\t: 1996.250
flags\t\t: sse2 avx fma avx2
"""
PI5 = """processor\t: 0
BogoMIPS\t: 108.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
CPU implementer\t: 0x41
CPU part\t: 0xd0b
"""
OLD = """vendor_id\t: GenuineIntel
model name\t: Intel(R) Core(TM)2 CPU @ 2.40GHz
flags\t\t: sse2 ssse3
"""


@pytest.mark.parametrize(
    ("cpuinfo", "threads", "max_khz", "gflops", "said"),
    [
        (XEON, 2, None, 64 * 2.9 * 2, "base clock in the model name"),  # 16 lanes x 2 FMA units x 2
        (ZEN4, 1, None, 32 * 2.6, "Zen 4"),  # AVX-512 double-pumped on 256-bit units
        (ZEN2, 2, None, 32 * 1.996 * 2, "cpu MHz"),  # AVX2 + FMA
        (PI5, 4, 2_400_000, 16 * 2.4 * 4, "cpufreq maximum"),  # NEON, the clock from cpufreq
        (PI5, 4, None, None, ""),  # an ARM cpuinfo names no clock: unknown
        (OLD, 1, None, None, ""),  # no FMA ISA this knows: unknown, not guessed
    ],
)
def test_the_nominal_rate_is_lanes_times_fma_units_times_clock_times_cores_and_says_it_is_an_estimate(
    cpuinfo: str, threads: int, max_khz: int | None, gflops: float | None, said: str
) -> None:
    found = nominal_fp32(cpuinfo, threads, max_khz)
    if gflops is None:
        assert found is None
        return
    assert found is not None and found.gflops == pytest.approx(gflops)
    assert said in found.how and "estimate" in found.how and found.as_dict()["estimate"] is True
