"""`--report DIR`: a folder a person opens to read a comparison or a load sweep.

It holds `report.md` and `report.html` (the same content: what ran, the load check, the tables
with intervals and verdicts when the documents carry them, the plots), `result.json` (the result
document), one CSV per run with a row per request (`requests/`), and the PNG plots: CDFs of TTFT,
TPOT and E2E per policy, queue length, batch size and KV use over time, per-tenant service over
time, and for a sweep latency and goodput against load. Each policy has one colour in every plot.

matplotlib is needed (the `report` extra); it is imported only here, when a report is written.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from ..experiments.run_series import RunSeries
from .document import Block, Heading, Image, Paragraph, to_html, to_markdown
from .tables import capacity_table, comparison_table, file_stem, fmt, manifest_table, points_table, verdict_table


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ValueError("--report: the plots need matplotlib: pip install 'metroline[report]'") from None


def _prepare(folder: str | Path) -> Path:
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"--report: {folder} is a file, not a folder")
    (folder / "requests").mkdir(parents=True, exist_ok=True)
    return folder


def _write(folder: Path, blocks: list[Block], title: str, doc: dict[str, Any]) -> None:
    from ..results.files import atomic_open, write_json

    with atomic_open(folder / "report.md", "--report") as f:  # whole or not at all, as every result file
        f.write(f"# {title}\n\n" + to_markdown(blocks))
    with atomic_open(folder / "report.html", "--report") as f:
        f.write(to_html([Heading(title, 1), *blocks], title))
    write_json(folder / "result.json", doc)


def _run_plots(folder: Path, series: dict[str, RunSeries], palette: dict[str, Any], where: str) -> list[Block]:
    from . import plots

    blocks: list[Block] = [Heading(f"Latency distributions{where}")]
    for metric, short, long in plots.LATENCIES:
        name = f"cdf_{metric}.png"
        plots.latency_cdf(series, metric, folder / name, palette)
        blocks.append(Image(name, f"CDF of {short} ({long}) per policy{where}"))
    blocks.append(Heading(f"Engine state and tenants over time{where}"))
    plots.engine_over_time(series, folder / "engine_over_time.png", palette)
    blocks.append(Image("engine_over_time.png", f"queue length, batch size and KV use over time{where}"))
    plots.tenant_service(series, folder / "tenant_service.png", palette)
    blocks.append(Image("tenant_service.png", f"service per tenant over time{where}"))
    return blocks


def _load_blocks(load: dict[str, Any] | None) -> list[Block]:
    if not load:
        return []
    text = load.get("message")
    if not text and "load" in load:
        text = (f"load: about {fmt(load['load'])} x the estimated capacity of {fmt(load['capacity_req_s'])} req/s "
                "(requests queue: the policies can differ at this load)")
    elif not text:
        text = (f"the rates swept cover the estimated capacity of {fmt(load['capacity_req_s'])} req/s "
                "(not too light at the highest rate, not too heavy at the lowest)")
    return [Heading("Load"), Paragraph(text)]


def write_compare_report(
    folder: str | Path, doc: dict[str, Any], labels: list[str], series: list[RunSeries],
) -> Path:
    """Write the report of a comparison: `doc` is its result document (`{"runs", "manifest",
    "load_check"?}`), `series` the `RunSeries` of each run, in the order of `labels`."""
    from ..results.files import write_requests_csv
    from . import plots

    _require_matplotlib()
    folder = _prepare(folder)
    runs = doc["runs"]
    palette = plots.colours(labels)
    by_label = dict(zip(labels, series))
    for label, s in by_label.items():
        write_requests_csv(folder / "requests" / f"{file_stem(label)}.csv", s.records)
    blocks: list[Block] = []
    manifest = manifest_table(doc.get("manifest"))
    if manifest:
        blocks += [Heading("What ran"), manifest]
    blocks += _load_blocks(doc.get("load_check"))
    blocks += [Heading("Results"), comparison_table(runs, labels)]
    verdicts = verdict_table(runs, labels)
    if verdicts:
        blocks += [Heading("Differences from the baseline"), verdicts]
    blocks += _run_plots(folder, by_label, palette, "")
    blocks.append(Paragraph("Per-request rows: " + ", ".join(f"requests/{file_stem(lb)}.csv" for lb in labels)))
    workload = (runs[0].get("workload") or {}).get("name", "?") if runs else "?"
    _write(folder, blocks, f"metroline compare: {', '.join(labels)} on {workload}", doc)
    return folder


def write_sweep_report(folder: str | Path, doc: dict[str, Any], series: dict[tuple[str, float], RunSeries]) -> Path:
    """Write the report of a load sweep: `doc` is `Sweep.document` (with its manifest), `series`
    the `RunSeries` of each (policy, rate) point."""
    from ..results.files import write_requests_csv
    from . import plots

    _require_matplotlib()
    folder = _prepare(folder)
    labels = doc["sweep"]["policies"]
    palette = plots.colours(labels)
    for (label, rate), s in series.items():
        write_requests_csv(folder / "requests" / f"{file_stem(label)}@{rate:.6g}.csv", s.records)
    _points_csv(folder / "points.csv", doc)
    bounds = ", ".join(f"{k} <= {v:g} s" for k, v in doc["sweep"]["bounds"].items())
    blocks: list[Block] = []
    manifest = manifest_table(doc.get("manifest"))
    if manifest:
        blocks += [Heading("What ran"), manifest]
    blocks += _load_blocks(doc.get("load_check"))
    blocks += [
        Heading("Capacity at SLO"),
        Paragraph(f"SLO: {bounds}; a rate is served at SLO when at least "
                  f"{doc['sweep']['attainment_target']:.0%} of its requests meet every bound. "
                  f"The workload's native rate is {fmt(doc['sweep']['native_rate_req_s'])} req/s."),
        capacity_table(doc),
        Heading("Against load"),
    ]
    plots.goodput_vs_load(doc, folder / "goodput_vs_load.png", palette)
    blocks.append(Image("goodput_vs_load.png", "goodput and SLO attainment against the offered load"))
    plots.latency_vs_load(doc["points"], folder / "latency_vs_load.png", palette)
    blocks.append(Image("latency_vs_load.png", "latency percentiles against the offered load"))
    rate = _common_rate(doc, series)
    if rate is not None:
        blocks += _run_plots(folder, {lb: series[lb, rate] for lb in labels}, palette, f" at {rate:.4g} req/s")
    blocks += [Heading("Every run"), points_table(doc),
               Paragraph("Per-point figures: points.csv; per-request rows: requests/POLICY@RATE.csv")]
    _write(folder, blocks, f"metroline sweep: {', '.join(labels)} on {doc['sweep']['workload']['name']}", doc)
    return folder


def _common_rate(doc: dict[str, Any], series: dict[tuple[str, float], RunSeries]) -> float | None:
    """A rate every policy ran at, the nearest to the median capacity at SLO (the per-run plots
    are drawn there); None when the policies share no rate."""
    labels = doc["sweep"]["policies"]
    common = sorted(set.intersection(*({r for lb, r in series if lb == label} for label in labels)))
    if not common:
        return None
    caps = sorted(c["rate_req_s"] for c in doc["capacity"].values() if c["rate_req_s"] is not None)
    target = caps[len(caps) // 2] if caps else common[len(common) // 2]
    return min(common, key=lambda r: (abs(r - target), r))


def _points_csv(path: Path, doc: dict[str, Any]) -> None:
    fields = ["policy", "rate_req_s", "rate_scale", "attainment", "goodput_req_s", "ttft_p50_s", "ttft_p99_s",
              "tpot_p50_s", "e2e_p99_s", "completed", "requests"]
    from ..results.files import atomic_open

    with atomic_open(path, "--report") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(fields)
        for p in doc["points"]:
            s = p["summary"]
            row = [p["policy"], p["offered"]["rate_req_s"], p["offered"]["rate_scale"], p["slo"]["attainment"],
                   p["slo"]["goodput_req_s"], s["ttft_s"]["p50"], s["ttft_s"]["p99"], s["tpot_s"]["p50"],
                   s["e2e_s"]["p99"], s["completed"], s["requests"]]
            w.writerow(["" if v is None else v for v in row])


__all__ = ["write_compare_report", "write_sweep_report"]
