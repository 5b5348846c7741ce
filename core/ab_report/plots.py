"""The report's plots, drawn with matplotlib (imported here only: `metroline --help` and a run
without `--report` never load it).

Every function draws one figure, saves it as a PNG and returns the `Figure` (closed: its axes
can still be read, which is how the tests check the labels). Each policy keeps one colour in every
plot (`colours`); axes say what they show and in which unit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..experiments.run_series import RunSeries
from ..experiments.slo import latencies

DPI = 110
LATENCIES = (("ttft", "TTFT", "time to first token"), ("tpot", "TPOT", "time per output token"),
             ("e2e", "E2E", "end-to-end latency"))


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def colours(labels: list[str]) -> dict[str, Any]:
    """One colour per policy label, in the order given (matplotlib's tab10, then tab20)."""
    from matplotlib import colormaps

    palette = list(colormaps["tab10"].colors) + list(colormaps["tab20"].colors[1::2])
    return {label: palette[i % len(palette)] for i, label in enumerate(labels)}


def _save(fig: Any, path: Path) -> Any:
    plt = _pyplot()
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return fig


def latency_cdf(series: dict[str, RunSeries], metric: str, path: Path, palette: dict[str, Any]) -> Any:
    """The CDF of one latency (`ttft`, `tpot` or `e2e`) of the completed requests, one line per
    policy; a log time axis when the values span more than two decades."""
    plt = _pyplot()
    short, long = next((s, lg) for m, s, lg in LATENCIES if m == metric)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    lowest, highest = float("inf"), 0.0
    for label, s in series.items():
        values = sorted(v for r in s.records if (v := latencies(r)[metric]) is not None and r.finish_s is not None)
        if not values:
            continue
        n = len(values)
        ax.step(values, [(i + 1) / n for i in range(n)], where="post", color=palette[label], label=label)
        positive = [v for v in values if v > 0]
        if positive:
            lowest, highest = min(lowest, positive[0]), max(highest, values[-1])
    if highest > 0 and lowest < highest / 100:
        ax.set_xscale("log")
    ax.set_xlabel(f"{short}, {long} (s)")
    ax.set_ylabel("fraction of completed requests")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"CDF of {short} per policy")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    return _save(fig, path)


def engine_over_time(series: dict[str, RunSeries], path: Path, palette: dict[str, Any]) -> Any:
    """Queue length, batch size and KV use over time, one line per policy, three panels."""
    plt = _pyplot()
    fig, axes = plt.subplots(3, 1, figsize=(8, 7.5), sharex=True)
    panels = (("queue", "queue length (requests)", 1.0), ("batch", "batch size (sequences)", 1.0),
              ("kv_use", "KV blocks in use (%)", 100.0))
    for ax, (attr, ylabel, scale) in zip(axes, panels):
        for label, s in series.items():
            ax.plot(s.bin_times(), [x * scale for x in getattr(s, attr)], color=palette[label], label=label, lw=1.2)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    axes[0].set_title("engine state over time (time-weighted mean per bin)")
    axes[0].legend(loc="upper right", fontsize="small")
    axes[-1].set_xlabel("time since the first arrival (s)")
    for ax in axes:
        ax.set_xlabel(axes[-1].get_xlabel())
        ax.label_outer()
    return _save(fig, path)


MAX_TENANTS = 6
"""The per-tenant plot shows the tenants served most, at most this many panels."""
SMOOTH_BINS = 5
"""The per-tenant service is a moving average over this many bins (a prompt's tokens all count
when its prefill ends, which makes single bins jumpy)."""


def moving_average(xs: list[float], width: int = SMOOTH_BINS) -> list[float]:
    """The centred moving average of `xs` over `width` values (fewer at the ends)."""
    half = width // 2
    out = []
    for i in range(len(xs)):
        window = xs[max(0, i - half): i + half + 1]
        out.append(sum(window) / len(window))
    return out


def tenant_service(series: dict[str, RunSeries], path: Path, palette: dict[str, Any]) -> Any:
    """Service per tenant over time (tokens per second: prompt tokens computed plus output
    tokens), one panel per tenant, one line per policy."""
    plt = _pyplot()
    totals: dict[str, float] = {}
    for s in series.values():
        for tenant, row in s.tenant_service.items():
            totals[tenant] = totals.get(tenant, 0.0) + sum(row)
    tenants = sorted(totals, key=lambda t: (-totals[t], t))[:MAX_TENANTS]
    fig, axes = plt.subplots(len(tenants) or 1, 1, figsize=(8, 2.3 * max(1, len(tenants)) + 0.6), sharex=True,
                             squeeze=False)
    axes = [row[0] for row in axes]
    for ax, tenant in zip(axes, tenants):
        for label, s in series.items():
            ax.plot(s.bin_times(), moving_average(s.tenant_service.get(tenant, [0.0] * len(s.batch))),
                    color=palette[label], label=label, lw=1.2)
        ax.set_ylabel("service (tokens/s)")
        ax.set_title(f"tenant {tenant}", fontsize="medium")
        ax.grid(True, alpha=0.3)
    axes[0].legend(loc="upper right", fontsize="small")
    fig.suptitle(f"service per tenant over time (prompt + output tokens, {SMOOTH_BINS}-bin moving average)",
                 fontsize="medium")
    for ax in axes:
        ax.set_xlabel("time since the first arrival (s)")
        ax.label_outer()
    return _save(fig, path)


SWEEP_LATENCIES = (("ttft_s", "p50", "TTFT p50 (s)", 1.0), ("ttft_s", "p99", "TTFT p99 (s)", 1.0),
                   ("tpot_s", "p50", "TPOT p50 (ms)", 1000.0), ("e2e_s", "p99", "E2E p99 (s)", 1.0))
"""(summary key, statistic, axis label with unit, scale from seconds) of the latency-against-load panels."""


def _by_policy(points: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for p in points:
        out.setdefault(p["policy"], []).append(p)
    return {k: sorted(v, key=lambda p: p["offered"]["rate_req_s"]) for k, v in out.items()}


def latency_vs_load(points: list[dict[str, Any]], path: Path, palette: dict[str, Any]) -> Any:
    """Latency percentiles against the offered rate, one line per policy, four panels."""
    plt = _pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(9, 6.5), sharex=True)
    for ax, (key, stat, ylabel, scale) in zip(axes.flat, SWEEP_LATENCIES):
        for label, pts in _by_policy(points).items():
            xs = [p["offered"]["rate_req_s"] for p in pts]
            ys = [(p["summary"].get(key) or {}).get(stat) for p in pts]
            ax.plot(xs, [float("nan") if y is None else y * scale for y in ys], marker="o", ms=3,
                    color=palette.get(label), label=label)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("offered load (requests/s)")
    axes.flat[0].legend(fontsize="small")
    fig.suptitle("latency against load")
    return _save(fig, path)


def goodput_vs_load(doc: dict[str, Any], path: Path, palette: dict[str, Any]) -> Any:
    """Goodput (requests/s within every SLO) and SLO attainment (%) against the offered rate, one
    line per policy; the attainment target and each policy's capacity at SLO marked."""
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True)
    for label, pts in _by_policy(doc["points"]).items():
        xs = [p["offered"]["rate_req_s"] for p in pts]
        top.plot(xs, [p["slo"]["goodput_req_s"] or 0.0 for p in pts], marker="o", ms=3, color=palette.get(label),
                 label=label)
        bottom.plot(xs, [100 * (p["slo"]["attainment"] or 0.0) for p in pts], marker="o", ms=3,
                    color=palette.get(label), label=label)
        capacity = (doc.get("capacity") or {}).get(label, {}).get("rate_req_s")
        if capacity is not None:
            bottom.axvline(capacity, color=palette.get(label), ls=":", lw=1)
    top.set_ylabel("goodput (requests/s within SLO)")
    bottom.set_ylabel("SLO attainment (% of requests)")
    bottom.axhline(100 * doc["sweep"]["attainment_target"], color="grey", ls="--", lw=1, label="target")
    bottom.set_xlabel("offered load (requests/s)")
    top.set_xlabel(bottom.get_xlabel())
    top.label_outer()
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
    top.legend(fontsize="small")
    bounds = ", ".join(f"{k} <= {v:g} s" for k, v in doc["sweep"]["bounds"].items())
    top.set_title(f"goodput and SLO attainment against load\nSLO: {bounds}; dashed: the "
                  f"{doc['sweep']['attainment_target']:.0%} target; dotted: each policy's capacity at SLO",
                  fontsize="medium")
    return _save(fig, path)
