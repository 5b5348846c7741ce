"""`metroline sweep`: policies across arrival rates, with SLO attainment, goodput and the capacity
at SLO of each (see `metroline.core.experiments.sweep`)."""

from __future__ import annotations

import argparse
from typing import Any

from .arms import policy_configs
from .compare import refuse_run_flags
from .logs import log_to_stderr
from .options import check_output_paths, make_executor, make_workload, resolve_run, workload_seed
from .outputs import check_report_folder, manifest_for, warn


def add_seed_flags(p: argparse.ArgumentParser) -> None:
    """`sweep --seeds N`: every policy at every rate on N paired draws, knees with intervals."""
    p.add_argument("--seeds", type=int, metavar="N",
                   help="run every policy at every rate of --rates on N draws of the workload (seeds --seed, --seed + 1, "
                   "...; a trace resampled): each policy's knee per draw with its interval, the knee ratio to the first "
                   "policy with a paired interval, bands over the draws in the report (default: one run, the workload "
                   "as given: a trace as recorded)")


def format_seeded(doc: dict[str, Any]) -> str:
    """The terminal summary of `sweep --seeds`: each policy's knee per draw and its interval, the
    knee ratios, and each rate's attainment over the draws."""
    sweep = doc["sweep"]
    bounds = ", ".join(f"{k} <= {v:g} s" for k, v in sweep["bounds"].items())
    seeds = sweep["seeds"]
    lines = [f"metroline sweep | workload {sweep['workload']['name']} | SLO {bounds} | {len(seeds)} draws "
             f"(seeds {', '.join(map(str, seeds))}) | native rates {', '.join(f'{r:.3g}' for r in sweep['native_rates_req_s'])} req/s",
             "", f"knee (capacity at SLO, req/s: attainment crosses {sweep['attainment_target']:.0%}, interpolated on "
             f"the grid {', '.join(f'{r:g}' for r in sweep['rates'])}); mean [95% interval] over the draws"]
    width = max(len(label) for label in sweep["policies"]) + 2
    for label in sweep["policies"]:
        cap = doc["capacity"][label]
        per = ", ".join("out of range" if k is None else f"{k:.3g}" for k in cap["knee_req_s"])
        knee = cap["knee"]
        text = (f"{knee['estimate']:.3g} [{knee['low']:.3g}, {knee['high']:.3g}]" if knee else
                f"no interval: {cap['out_of_range']} draw(s) out of the grid's range")
        lines.append(f"  {label:<{width}}{text}   per draw: {per}")
    for label, r in doc["ratio"].items():
        ratio = r["ratio"]
        text = (f"{ratio['estimate']:.3f} [{ratio['low']:.3f}, {ratio['high']:.3f}]" if ratio else "no interval (a knee out of range)")
        per = ", ".join("-" if x is None else f"{x:.3f}" for x in r["per_draw"])
        lines.append(f"  knee ratio {label}/{r['vs']}: {text} (geometric mean, paired; per draw: {per})")
    lines += ["", "attainment by rate: mean [95% interval] over the draws"]
    for label, rows in doc["bands"].items():
        cells = [f"{row['rate_req_s']:g}: {row['attainment']['estimate']:.0%} [{row['attainment']['low']:.0%}, "
                 f"{row['attainment']['high']:.0%}]" for row in rows]
        lines.append(f"  {label:<{width}}" + "; ".join(cells))
    return "\n".join(lines) + "\n"


def parse_rates(text: str) -> list[float] | None:
    """`--rates`: `auto` (None: bisection) or comma-separated requests per second, each > 0."""
    if text.strip().lower() == "auto":
        return None
    from ..experiments.slo import positive_number

    rates = [positive_number(item, "--rates", "requests per second") for item in (p.strip() for p in text.split(",")) if item]
    if not rates:
        raise ValueError("--rates: give rates in requests per second (r1,r2,...) or auto")
    return rates


def sweep_load_check(sweep: Any) -> dict[str, Any] | None:
    """The load check at the lowest and the highest rate every policy ran: a warning when even the
    highest is too light, or even the lowest too heavy, for the policies to differ. A rate whose
    run is too short to judge (its arrivals span a few service times: a high rate on few
    requests) gives no capacity; the capacity is then the other end's, or None with a note."""
    from ..experiments.load_check import check

    labels = sweep.labels
    common = sorted(set.intersection(*({r for lb, r in sweep.series if lb == label} for label in labels)))
    if not common:
        return None
    low = check([sweep.series[lb, common[0]].load for lb in labels], labels)
    high = check([sweep.series[lb, common[-1]].load for lb in labels], labels)
    if low is None and high is None:
        return None
    kind_low, kind_high = (None if c is None else c["kind"] for c in (low, high))
    judged = [c for c in (high, low) if c is not None and c.get("capacity_req_s")]
    capacity = judged[0]["capacity_req_s"] if judged else None
    result = {"lowest_rate": {"rate_req_s": common[0], "kind": kind_low},
              "highest_rate": {"rate_req_s": common[-1], "kind": kind_high},
              "capacity_req_s": capacity, "message": None}
    if capacity is None:
        short = next(c for c in (high, low) if c is not None)
        result["message"] = short.get("message") or "note: the load of the rates swept cannot be judged"
        return result
    near = f"the estimated capacity is about {capacity:.4g} req/s: rates around it, e.g. --rates " + ",".join(
        f"{capacity * f:.3g}" for f in (0.5, 0.8, 0.95, 1.1, 1.3))
    if kind_high == "light":
        result["message"] = f"warning: every rate is too light for the policies to differ (up to {common[-1]:.4g} req/s); {near}"
    elif kind_low == "heavy":
        result["message"] = f"warning: every rate is too heavy (from {common[0]:.4g} req/s): the queue grows without bound; {near}"
    elif kind_high == "short" and kind_low != "fine":
        result["message"] = (f"note: at {common[-1]:.4g} req/s the requests arrive too fast for the load to be judged "
                             f"(a burst shorter than a few service times); {near}")
    return result


def format_sweep(doc: dict[str, Any]) -> str:
    """The terminal summary: each policy's capacity at SLO, then every point."""
    from ..ab_report.tables import capacity_table, points_table

    lines = []
    bounds = ", ".join(f"{k} <= {v:g} s" for k, v in doc["sweep"]["bounds"].items())
    lines.append(f"metroline sweep | workload {doc['sweep']['workload']['name']} | SLO {bounds} | "
                 f"native rate {doc['sweep']['native_rate_req_s']:.4g} req/s")
    for table in (capacity_table(doc), points_table(doc)):
        widths = [max(len(row[i]) for row in [table.header, *table.rows]) for i in range(len(table.header))]
        lines.append("")
        for row in [table.header, *table.rows]:
            lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
    return "\n".join(lines) + "\n"


def cmd_sweep(args: argparse.Namespace) -> int:
    """Run every policy at each rate of `--rates` (or find each one's capacity at SLO by bisection)."""
    from ..experiments.slo import parse_slo
    from ..experiments.sweep import Sweep

    refuse_run_flags(args)
    resolved = resolve_run(args)
    config, run = resolved.config, resolved.run
    if resolved.cluster is not None:
        raise ValueError(f"{args.config}: cluster: sweep runs one engine per rate; a cluster runs under "
                         "`metroline run` and `compare` (remove the [cluster] table for the sweep)")
    if config.debug:
        log_to_stderr()
    check_output_paths(args)
    check_report_folder(args)
    bounds = parse_slo(args.slo)
    rates = parse_rates(args.rates)
    if run.get("rate_scale", 1.0) != 1.0:
        raise ValueError("--rate-scale: a sweep sets the rate itself; give --rates in requests per second")
    if args.jobs is not None and args.jobs < 1:
        raise ValueError(f"--jobs: must be at least 1, got {args.jobs}")
    if not args.tolerance > 0:
        raise ValueError(f"--tolerance: must be > 0, got {args.tolerance}")
    labels, configs = policy_configs(args.policies, config)
    executor = make_executor(run)
    if getattr(executor, "kv_bytes_per_token", None):
        raise ValueError("sweep: runs the simulator only (--executor sim); a real model's sweep would take hours")
    if args.seeds is not None:
        return _seeded(args, config, run, labels, configs, bounds, rates)
    workload = make_workload(run, workload_seed(config))  # no --seed: a trace as recorded
    manifest = manifest_for(args, config, run, workload, configs)
    sweep = Sweep(workload, labels, configs, lambda: make_executor(run), bounds, **_run_options(args, run))
    if rates is None:
        doc = sweep.document(sweep.bisect(tolerance=args.tolerance), "auto", args.tolerance)
    else:
        doc = sweep.document(sweep.over_rates(rates), "rates", None)

    def report(folder: Any) -> Any:
        from ..ab_report import write_sweep_report

        return write_sweep_report(folder, doc, sweep.series)

    return _emit(args, doc, sweep, manifest, format_sweep, report)


def _run_options(args: argparse.Namespace, run: dict[str, Any]) -> dict[str, Any]:
    """The options of a sweep's runs (`run_many`'s)."""
    return dict(jobs=args.jobs, ray=args.ray, oracle_lengths=bool(run.get("oracle_lengths")), progress=args.progress,
                window_s=run.get("window", 60.0))


def _emit(args: argparse.Namespace, doc: dict[str, Any], sweep: Any, manifest: dict[str, Any],
          text: Any, report: Any) -> int:
    """A sweep's ending: its load check and manifest in `doc`, `text(doc)` printed, the warning,
    the JSON and the `report(folder)`."""
    from ..results import files as result_files

    doc["load_check"] = sweep_load_check(sweep)
    doc["manifest"] = manifest
    print(text(doc), end="")
    warn(doc["load_check"])
    if args.json:
        result_files.write_json(args.json, doc)
    if args.report:
        print(f"report: {report(args.report) / 'report.html'}")
    return 0


def _seeded(args: argparse.Namespace, config: Any, run: dict[str, Any], labels: list[str], configs: list[Any],
            bounds: dict[str, float], rates: list[float] | None) -> int:
    """`sweep --seeds N` (see `core/experiments/sweep_seeds.py`)."""
    from ..experiments.sweep_seeds import SeededSweep
    from .compare import seed_workloads

    if args.seeds < 2:
        raise ValueError(f"--seeds: must be at least 2 (an interval needs two draws), got {args.seeds}")
    if rates is None:
        raise ValueError("--seeds: give --rates r1,r2,... (one grid for every draw and policy), not auto")
    if len(rates) < 2:
        raise ValueError("--seeds: give at least two --rates (a knee lies between two of them)")
    seeds, workloads = seed_workloads(run, workload_seed(config), args.seeds)
    manifest = manifest_for(args, config, run, workloads[0], configs)
    manifest["seeds"]["workload"] = seeds
    sweep = SeededSweep(workloads, seeds, labels, configs, lambda: make_executor(run), bounds, **_run_options(args, run))
    doc = sweep.document(sweep.over_rates(rates))

    def report(folder: Any) -> Any:
        from ..ab_report.sweep_bands import write_seeded_sweep_report

        return write_seeded_sweep_report(folder, doc)

    return _emit(args, doc, sweep.sweeps[0], manifest, format_seeded, report)
