"""The conversion report beside the bundles: JSON, an HTML page, and a latency-vs-accuracy plot per profile.

Files are written to a temporary name and renamed, so `out` never holds half a report.
"""

from __future__ import annotations

import html
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from edgefleet.converter.model import SourceModel
from edgefleet.converter.request import ConvertRequest, ProfileResult
from edgefleet.core.bundle.manifest import GoldenHold, ResourceNeeds


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_report(
    request: ConvertRequest,
    source: SourceModel,
    metric: str,
    results: list[ProfileResult],
    work: Path,
    plot: bool = True,
) -> dict[str, Path]:
    """`plot`: draw each profile's latency-vs-accuracy plot (False when the time budget leaves no time for it)."""
    stem = f"{request.name}-{request.version}"
    document: dict[str, Any] = {
        "model": str(request.model),
        "source_sha256": source.sha256,
        "name": request.name,
        "version": request.version,
        "metric": metric,
        "threads": request.threads,
        "profiles": [asdict(r) for r in results],
    }
    written = {"json": request.out / f"{stem}.report.json"}
    _atomic_write(written["json"], json.dumps(document, indent=2, default=str).encode("utf-8"))
    plots: dict[str, str] = {}
    for result in results:
        png = _plot(result, metric, work) if plot else None
        if png is not None:
            target = request.out / f"{stem}-{result.profile}.png"
            _atomic_write(target, png.read_bytes())
            plots[result.profile] = target.name
            written[f"png:{result.profile}"] = target
    written["html"] = request.out / f"{stem}.report.html"
    _atomic_write(written["html"], _html(document, plots).encode("utf-8"))
    return written


def _plot(result: ProfileResult, metric: str, work: Path) -> Path | None:
    points = [c for c in result.candidates if c.get("latency_ms") is not None and c.get("accuracy") is not None]
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    for cand in points:
        chosen = cand["name"] == result.recipe
        missed = str(cand.get("rejected") or "").startswith(("accuracy", "SQNR"))
        ax.scatter(
            [float(cand["latency_ms"])],  # type: ignore[arg-type]
            [float(cand["accuracy"])],  # type: ignore[arg-type]
            marker="*" if chosen else ("x" if missed else "o"),
            s=160 if chosen else 50,
            color="tab:green" if chosen else "tab:blue",
        )
        ax.annotate(str(cand["name"]), (cand["latency_ms"], cand["accuracy"]), fontsize=7, xytext=(4, 4),
                    textcoords="offset points")  # fmt: skip
    ax.set_xlabel("median latency (ms, this machine)")
    ax.set_ylabel(metric)
    ax.set_title(f"{result.profile}: latency vs {metric}")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    path = work / f"plot-{result.profile}.png"
    fig.savefig(path)
    plt.close(fig)
    return path


def _cell(value: Any, digits: int = 4) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return html.escape(str(value))


def _farm_table(farm: dict[str, Any]) -> str:
    """`--measure-on`: the chosen recipe as each device measured it, and when."""
    head = ["device", "profile", "provider", "threads", "CPU share", "p50 ms", "p90 ms", "p99 ms", "load ms", "at"]
    keys = ["device_id", "profile", "provider", "threads", "cpu_share", "p50_ms", "p90_ms", "p99_ms", "load_ms"]
    rows = "".join(
        "<tr>" + "".join(f"<td>{_cell(d.get(k))}</td>" for k in keys) + f"<td>{_cell(d.get('measured_at'))}</td></tr>"
        for d in farm.get("devices", [])
    )
    caption = f"<p>measured on the devices: {html.escape(str(farm.get('statistic', '')))}</p>"
    header = "".join(f"<th>{h}</th>" for h in head)
    return f"{caption}<table><tr>{header}</tr>{rows}</table>"


def _head_to_head_table(h2h: dict[str, Any]) -> str:
    """The finalists re-timed together before the choice (converter.head_to_head), and the decision."""
    caption = (
        f"<p>head to head: {h2h['rounds']} interleaved rounds at {h2h['threads']} thread(s), order rotated, each "
        f"block after the other runtime's threads went quiet and {h2h['warmup_runs']} untimed runs; chosen "
        f"<b>{html.escape(str(h2h['chosen']))}</b>: {html.escape(str(h2h['why']))} (tie-break: "
        f"{html.escape(str(h2h['tie_break']))})</p>"
    )
    head = ["finalist", "runtime", "precision", "size KB", "timing phase ms", "head to head ms", "runs/round",
            "round medians ms"]  # fmt: skip
    rows = "".join(
        f"<tr{' class=win' if f['name'] == h2h['chosen'] else ''}><td>{_cell(f['name'])}</td><td>{_cell(f['runtime'])}"
        f"</td><td>{_cell(f['precision'])}</td><td>{_cell(f['size_bytes'] / 1e3, 1)}</td>"
        f"<td>{_cell(f['timing_phase_median_ms'])}</td><td>{_cell(f['median_ms'])}</td><td>{_cell(f['runs_per_round'])}"
        f"</td><td>{html.escape(', '.join(f'{v:.3g}' for v in f['round_medians_ms']))}</td></tr>"
        for f in h2h["finalists"]
    )
    return caption + "<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + f"</tr>{rows}</table>"


def _roofline_table(profile: dict[str, Any]) -> str:
    """How near each candidate runs to this machine's limit (converter.roofline)."""
    lines: dict[str, dict[str, Any]] = profile.get("roofline") or {}
    if not lines:
        return ""
    limits = profile.get("limits")
    if limits:
        rates = "; ".join(
            f"{runtime} " + ", ".join(f"{p} {v:.0f}" for p, v in sorted(values.items()))
            for runtime, values in sorted(limits["gemm_gops"].items())
            if values
        )
        caption = (
            f"<p>% of the limit: this machine ({html.escape(str(limits['cpu']))}, {limits['threads']} thread(s)) "
            f"measured at GEMM GOP/s {html.escape(rates)} and {limits['bandwidth_gbs']:.1f} GB/s memory bandwidth "
            f"(load average {limits.get('load_average', 0):.2f}, {html.escape(str(limits['measured_at']))})</p>"
        )
    else:
        caption = (
            "<p>work per inference and achieved rates (the latencies were measured on the devices, whose "
            "limits are not measured)</p>"
        )
    head = ["candidate", "MMACs", "MACs by precision", "weights KB", "moved KB", "median ms", "GOP/s", "GB/s",
            "% compute", "% bandwidth", "bound", "% of limit"]  # fmt: skip
    rows = []
    for name, line in lines.items():
        if "error" in line:
            rows.append(f"<tr><td>{_cell(name)}</td><td colspan={len(head) - 1}>{_cell(line['error'])}</td></tr>")
            continue
        work = line["work"]
        split = ", ".join(f"{p} {v / 1e6:.3g}M" for p, v in work["macs_by_precision"].items())
        cls = " class='win'" if name == profile["recipe"] else ""
        rows.append(
            f"<tr{cls}><td>{_cell(name)}</td><td>{_cell(work['macs'] / 1e6, 2)}</td><td>{_cell(split)}</td>"
            f"<td>{_cell(work['weight_bytes'] / 1e3, 1)}</td><td>{_cell(work['bytes_moved'] / 1e3, 1)}</td>"
            f"<td>{_cell(line['latency_ms'])}</td><td>{_cell(line['achieved_gops'], 2)}</td>"
            f"<td>{_cell(line['achieved_gbs'], 2)}</td><td>{_cell(line.get('compute_pct'), 1)}</td>"
            f"<td>{_cell(line.get('bandwidth_pct'), 1)}</td><td>{_cell(line.get('bound'))}</td>"
            f"<td>{_cell(line.get('limit_pct'), 1)}</td></tr>"
        )
    return caption + "<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>" + "".join(rows) + "</table>"


def _time_budget_table(spent: dict[str, Any]) -> str:
    """What --time-budget cut (converter.deadline): one row per cut, or a line saying nothing was."""
    caption = f"<p>time budget {spent['budget_s']:g} s, this profile done at {spent['seconds']:g} s: "
    if not spent["cut"]:
        return caption + "nothing cut</p>"
    rows = "".join(f"<tr><td>{_cell(c['what'])}</td><td>{_cell(c['how'])}</td></tr>" for c in spent["cut"])
    return caption + "what it cut</p><table><tr><th>cut</th><th>how</th></tr>" + rows + "</table>"


def _html(document: dict[str, Any], plots: dict[str, str]) -> str:
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>edgefleet conversion: {html.escape(document['name'])} {html.escape(document['version'])}</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}.win{background:#e6f4e6}</style></head><body>",
        f"<h1>{html.escape(document['name'])} {html.escape(document['version'])}</h1>",
        f"<p>source {html.escape(document['model'])} (sha256 {document['source_sha256'][:16]}…), metric "
        f"<b>{html.escape(document['metric'])}</b>, {document['threads']} inference thread(s)</p>",
    ]
    for profile in document["profiles"]:
        verdict = (
            f"bundle <code>{html.escape(Path(profile['bundle']).name)}</code>: {_cell(profile['recipe'])}"
            if profile["bundle"]
            else f"no bundle: {_cell(profile['error'])}"
        )
        parts.append(f"<h2>{html.escape(profile['profile'])}</h2><p>{verdict}</p>")
        if profile.get("golden"):
            held = GoldenHold.model_validate(profile["golden"])
            parts.append(f"<p class='golden'>{html.escape(held.summary())} ({html.escape(held.runtime)})</p>")
        if profile.get("resources"):
            needs = ResourceNeeds.model_validate(profile["resources"])
            parts.append(f"<p class='resources'>{html.escape(needs.summary())}</p>")
        if profile["notes"]:
            parts.append("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in profile["notes"]) + "</ul>")
        if profile.get("time_budget"):
            parts.append(_time_budget_table(profile["time_budget"]))
        if profile.get("farm"):
            parts.append(_farm_table(profile["farm"]))
        if profile.get("head_to_head"):
            parts.append(_head_to_head_table(profile["head_to_head"]))
        if profile["profile"] in plots:
            parts.append(f"<img src='{html.escape(plots[profile['profile']])}' alt='latency vs accuracy'>")
        if profile["candidates"]:
            parts.append(
                "<table><tr><th>candidate</th><th>runtime</th><th>provider</th><th>precision</th><th>accuracy</th>"
                "<th>SQNR dB</th><th>median ms</th><th>size KB</th><th>why it lost</th></tr>"
            )
            for c in profile["candidates"]:
                cls = " class='win'" if c["name"] == profile["recipe"] else ""
                size = c["size_bytes"] / 1e3 if c["size_bytes"] else None
                parts.append(
                    f"<tr{cls}><td>{_cell(c['name'])}</td><td>{_cell(c['runtime'])}</td><td>{_cell(c['provider'])}</td>"
                    f"<td>{_cell(c['precision'])}</td><td>{_cell(c['accuracy'])}</td><td>{_cell(c['sqnr_db'], 1)}</td>"
                    f"<td>{_cell(c['latency_ms'])}</td><td>{_cell(size, 1)}</td><td>{_cell(c['rejected'])}</td></tr>"
                )
            parts.append("</table>")
        parts.append(_roofline_table(profile))
    parts.append("</body></html>")
    return "\n".join(parts)
