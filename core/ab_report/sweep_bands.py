"""The report of `sweep --seeds N`: SLO attainment and goodput against the offered rate with a
shaded band per policy (the 95% interval over the draws at each rate of the common grid, lines
only between measured rates), each policy's knee interval shaded on the rate axis, and the title
naming the load (workload, draws, their native rates, the SLO)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .document import Heading, Image, Paragraph


def load_title(doc: dict[str, Any]) -> str:
    """What load a figure shows: the workload, its draws and native rates, the SLO and target."""
    sweep = doc["sweep"]
    bounds = ", ".join(f"{k} <= {v:g} s" for k, v in sweep["bounds"].items())
    natives = sweep["native_rates_req_s"]
    return (f"{sweep['workload']['name']} ({sweep['workload']['requests']} requests), {len(sweep['seeds'])} draws "
            f"(native {min(natives):.3g}-{max(natives):.3g} req/s); SLO {bounds}, target {sweep['attainment_target']:.0%}")


def bands_plot(doc: dict[str, Any], path: Path) -> Any:
    """Attainment (top) and goodput (bottom) against the rate, a band per policy; knee intervals shaded."""
    from .plots import _pyplot, _save, colours

    plt = _pyplot()
    palette = colours(doc["sweep"]["policies"])
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True)
    for label, rows in doc["bands"].items():
        xs = [r["rate_req_s"] for r in rows]
        for ax, key, scale in ((top, "attainment", 100.0), (bottom, "goodput_req_s", 1.0)):
            ax.plot(xs, [scale * r[key]["estimate"] for r in rows], marker="o", ms=3, color=palette[label], label=label)
            ax.fill_between(xs, [scale * r[key]["low"] for r in rows], [scale * r[key]["high"] for r in rows],
                            color=palette[label], alpha=0.2, lw=0)
        knee = doc["capacity"][label]["knee"]
        if knee is not None:
            top.axvspan(knee["low"], knee["high"], color=palette[label], alpha=0.12)
            top.axvline(knee["estimate"], color=palette[label], ls=":", lw=1)
    top.axhline(100 * doc["sweep"]["attainment_target"], color="grey", ls="--", lw=1, label="target")
    top.set_ylabel("SLO attainment (% of requests)")
    bottom.set_ylabel("goodput (requests/s within SLO)")
    bottom.set_xlabel("offered load (requests/s)")
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
    top.legend(fontsize="small")
    top.set_title(f"{load_title(doc)}\nbands: 95% interval over the draws; shaded span, dotted line: each policy's "
                  "knee interval and mean", fontsize="small")
    return _save(fig, path)


def write_seeded_sweep_report(folder: str | Path, doc: dict[str, Any]) -> Path:
    """Write `report.md`, `report.html`, `result.json` and the band plot of a `sweep --seeds` document."""
    from . import _prepare, _require_matplotlib, _write

    _require_matplotlib()
    folder = _prepare(folder)
    bands_plot(doc, folder / "attainment_bands.png")
    lines = []
    for label in doc["sweep"]["policies"]:
        knee = doc["capacity"][label]["knee"]
        lines.append(f"{label}: " + (f"{knee['estimate']:.3g} req/s [{knee['low']:.3g}, {knee['high']:.3g}]" if knee
                                     else f"out of the grid on {doc['capacity'][label]['out_of_range']} draw(s)"))
    for label, r in doc["ratio"].items():
        ratio = r["ratio"]
        lines.append(f"knee ratio {label}/{r['vs']}: " + (f"{ratio['estimate']:.3f} [{ratio['low']:.3f}, {ratio['high']:.3f}]"
                                                        if ratio else "no interval"))
    blocks = [Heading("Knees over the draws"), Paragraph(load_title(doc)), Paragraph("; ".join(lines)),
              Image("attainment_bands.png", "SLO attainment and goodput against load, bands over the draws")]
    _write(folder, blocks, f"metroline sweep over {len(doc['sweep']['seeds'])} draws", doc)
    return folder
