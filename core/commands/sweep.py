"""`metroline sweep`: policies across arrival rates, with SLO attainment, goodput and the capacity
at SLO of each (see `core/sweep.py`)."""

from __future__ import annotations

import argparse
from typing import Any

from .compare import policy_configs, refuse_run_flags
from .logs import log_to_stderr
from .options import check_output_paths, cluster_options, make_executor, make_workload, resolve_options
from .outputs import check_report_folder, manifest_for, warn


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
    from ..results import files as result_files

    refuse_run_flags(args)
    config, run = resolve_options(args)
    if cluster_options(args) is not None:
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
    workload = make_workload(run, config.seed)
    manifest = manifest_for(args, config, run, workload, configs)
    sweep = Sweep(workload, labels, configs, lambda: make_executor(run), bounds, jobs=args.jobs, ray=args.ray,
                  oracle_lengths=bool(run.get("oracle_lengths")), progress=args.progress,
                  window_s=run.get("window", 60.0))
    if rates is None:
        doc = sweep.document(sweep.bisect(tolerance=args.tolerance), "auto", args.tolerance)
    else:
        doc = sweep.document(sweep.over_rates(rates), "rates", None)
    doc["load_check"] = sweep_load_check(sweep)
    doc["manifest"] = manifest
    print(format_sweep(doc), end="")
    warn(doc["load_check"])
    if args.json:
        result_files.write_json(args.json, doc)
    if args.report:
        from ..ab_report import write_sweep_report

        folder = write_sweep_report(args.report, doc, sweep.series)
        print(f"report: {folder / 'report.html'}")
    return 0
