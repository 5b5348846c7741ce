"""`metroline plot FILE...`: PNG plots drawn from result documents already written with `--json`,
without running anything again.

- a comparison over seeds (`compare --seeds K --json`): `NAME.differences.png`, each policy's
  paired difference from the baseline, relative, per metric, with its interval and verdict
  (`paired_differences`), and `NAME.means.png`, each policy's mean with its interval;
- a load sweep (`sweep --json`): `NAME.latency_vs_load.png` and `NAME.goodput_vs_load.png`
  (`plots.latency_vs_load`, `plots.goodput_vs_load`); over seeds (`sweep --seeds`):
  `NAME.attainment_bands.png` (`sweep_bands.bands_plot`);
- a run or a comparison of one draw (`run --json`, `compare --json`): `NAME.latency.png`, the TTFT,
  TPOT, E2E and queue percentiles of each run.

NAME is the file's name without `.json`. matplotlib is needed (the `report` extra).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

VERDICT_COLOURS = {"better": "tab:green", "worse": "tab:red"}
"""The marker colour of a verdict (others: grey)."""


def kind_of(doc: Any) -> str:
    """`"seeds"`, `"sweep"`, `"seeded_sweep"` or `"runs"`: which plots a document gets."""
    if isinstance(doc, dict):
        if "comparison" in doc and "policies" in (doc["comparison"] or {}):
            return "seeds"
        if "bands" in doc and "sweep" in doc:
            return "seeded_sweep"
        if "points" in doc and "sweep" in doc:
            return "sweep"
        if "summary" in doc or all(isinstance(r, dict) and "summary" in r for r in doc.get("runs") or [None]):
            return "runs"
    raise ValueError("not a result document of run, compare or sweep (written with --json)")


def _label(doc: dict[str, Any]) -> str:
    return str(doc.get("label") or doc.get("policy", "?"))


def paired_differences(doc: dict[str, Any], path: Path) -> Path:
    """One panel per policy but the baseline: each metric with a direction (latencies, throughputs)
    as its relative difference from the baseline in %, with its interval; the marker's colour is
    the verdict (green better, red worse, grey no difference)."""
    from .plots import _pyplot, _save

    plt = _pyplot()
    c = doc["comparison"]
    others = [p for p in c["policies"] if p != c["baseline"]]
    metrics = [(key, m["label"]) for key, m in c["metrics"].items() if m.get("direction") and any(
        (c["policies"][p][key].get("vs_baseline") or {}).get("relative") for p in others)]
    fig, axes = plt.subplots(1, len(others), figsize=(6.5 * len(others), 0.45 * len(metrics) + 1.6), squeeze=False)
    for ax, policy in zip(axes[0], others):
        ys = list(range(len(metrics)))[::-1]
        for y, (key, label) in zip(ys, metrics):
            vs = c["policies"][policy][key].get("vs_baseline") or {}
            rel = vs.get("relative")
            if not rel:
                continue
            colour = VERDICT_COLOURS.get(vs.get("verdict"), "grey")
            est, low, high = (100 * rel[k] for k in ("estimate", "low", "high"))
            ax.errorbar(est, y, xerr=[[est - low], [high - est]], fmt="o", color=colour, capsize=3)
        ax.axvline(0, color="black", lw=0.8)
        ax.set_yticks(ys, [label for _, label in metrics])
        ax.set_xlabel(f"{policy} vs {c['baseline']}: relative difference (%)")
        ax.grid(True, axis="x", alpha=0.3)
        ax.set_title(f"{policy} vs {c['baseline']}, {len(c['seeds'])} seeds: paired difference, "
                     f"{c['level']:.0%} interval\ngreen better, red worse, grey no difference "
                     f"({c['correction']} over the table)", fontsize="small")
    _save(fig, path)
    return path


def means(doc: dict[str, Any], path: Path) -> Path:
    """Each policy's mean over the seeds with its interval: TTFT mean and p99, E2E mean,
    throughput (one panel each)."""
    from .plots import _pyplot, _save, colours

    plt = _pyplot()
    c = doc["comparison"]
    policies = list(c["policies"])
    palette = colours(policies)
    panels = [(key, c["metrics"][key]["label"], scale, unit) for key, scale, unit in (
        ("summary.ttft_s.mean", 1000, "ms"), ("summary.ttft_s.p99", 1000, "ms"), ("summary.e2e_s.mean", 1000, "ms"),
        ("summary.output_throughput_tok_s", 1, "tok/s")) if key in c["metrics"]]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.4), squeeze=False)
    for ax, (key, label, scale, unit) in zip(axes[0], panels):
        for x, policy in enumerate(policies):
            m = c["policies"][policy][key]["mean"]
            est, low, high = (scale * m[k] for k in ("estimate", "low", "high"))
            ax.errorbar(x, est, yerr=[[est - low], [high - est]], fmt="o", color=palette[policy], capsize=4)
        ax.set_xticks(range(len(policies)), policies)
        ax.set_xlim(-0.5, len(policies) - 0.5)
        ax.set_title(f"{label} ({unit})", fontsize="small")
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"mean over {len(c['seeds'])} seeds, {c['level']:.0%} interval", fontsize="small")
    _save(fig, path)
    return path


def latency_percentiles(runs: list[dict[str, Any]], path: Path) -> Path:
    """TTFT, TPOT, E2E and queue at p50, p90, p99 (ms), one group of bars per run."""
    from .plots import _pyplot, _save, colours

    plt = _pyplot()
    labels = [_label(r) for r in runs]
    palette = colours(labels)
    fig, axes = plt.subplots(1, 4, figsize=(13, 3.4))
    width = 0.8 / max(1, len(runs))
    for ax, (key, name) in zip(axes, (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "E2E"), ("queue_s", "queue"))):
        for i, (label, run) in enumerate(zip(labels, runs)):
            dist = run["summary"].get(key) or {}
            values = [1000 * (dist.get(p) or 0.0) for p in ("p50", "p90", "p99")]
            ax.bar([x + i * width for x in range(3)], values, width, color=palette[label], label=label)
        ax.set_xticks([x + width * (len(runs) - 1) / 2 for x in range(3)], ["p50", "p90", "p99"])
        ax.set_title(f"{name} (ms)", fontsize="small")
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].legend(fontsize="small")
    _save(fig, path)
    return path


def plot_file(source: str | Path, folder: str | Path) -> list[Path]:
    """Draw the plots of the result document at `source` into `folder` (made if missing); returns
    the files written. `ValueError` naming the file when it is not a result document."""
    from . import _require_matplotlib
    from . import plots as run_plots
    from .sweep_bands import bands_plot

    _require_matplotlib()
    source, folder = Path(source), Path(folder)
    try:
        doc = json.loads(source.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"plot: {source}: not a JSON result document ({exc.msg} at line {exc.lineno})") from None
    try:
        kind = kind_of(doc)
    except ValueError as exc:
        raise ValueError(f"plot: {source}: {exc}") from None
    folder.mkdir(parents=True, exist_ok=True)
    stem = source.name.removesuffix(".json")
    out = lambda name: folder / f"{stem}.{name}.png"  # noqa: E731
    if kind == "seeds":
        return [paired_differences(doc, out("differences")), means(doc, out("means"))]
    if kind == "seeded_sweep":
        bands_plot(doc, out("attainment_bands"))
        return [out("attainment_bands")]
    if kind == "sweep":
        palette = run_plots.colours(doc["sweep"]["policies"])
        run_plots.latency_vs_load(doc["points"], out("latency_vs_load"), palette)
        run_plots.goodput_vs_load(doc, out("goodput_vs_load"), palette)
        return [out("latency_vs_load"), out("goodput_vs_load")]
    runs = [doc] if "summary" in doc else doc["runs"]
    return [latency_percentiles(runs, out("latency"))]
