"""`metroline compare`: the same workload under several policies, side by side."""

from __future__ import annotations

import argparse
from typing import Any

from .flags import COMPARE_REFUSED
from .arms import policy_configs, router_specs
from .compare_aa import aa_configs, aa_runs
from .logs import log_to_stderr
from .options import (
    check_output_paths,
    fit_config,
    make_executor,
    make_workload,
    measurement,
    resolve_run,
    workload_seed,
)
from .outputs import check_report_folder, manifest_for, warn, warn_speculation

POLICIES = ("fcfs", "static", "priority", "srpt", "weighted_fair", "token_rr")
"""The shipped ordering policies: what `metroline compare` compares by default."""
DEFAULT_WORKLOAD = "chat-steady"
"""The workload of a `compare` of one engine that names none (`--workload`, or `workload` in the
config file's `[run]` table): chat's requests at about 0.8 x the default engine's capacity, where
the policies differ (`run`'s default, `chat`, is an overload: 5.9 x under the roofline model)."""


def refuse_run_flags(args: argparse.Namespace) -> None:
    """Refuse the flags of `run` that a command of several policies does not take (`COMPARE_REFUSED`)."""
    for key, why in COMPARE_REFUSED.items():
        if getattr(args, key, None) is not None:
            raise ValueError(f"--{key.replace('_', '-')}: {why}")


def seed_workloads(run: dict[str, Any], seed: int | None, k: int) -> tuple[list[int], list[Any]]:
    """The K workload draws of `compare --seeds K`: seeds `seed`, `seed` + 1, ... (`seed` None: the
    workload's own seed, a spec file's or 0), each a synthetic workload drawn with its seed or a
    trace resampled with it."""
    first = make_workload(run, seed)
    if seed is None:
        seed = first.params.get("seed")
        if seed is None:  # a trace as recorded: its draws are resamples 0, 1, ...
            seed, first = 0, make_workload(run, 0)
    seeds = [seed + i for i in range(k)]
    return seeds, [first, *(make_workload(run, s) for s in seeds[1:])]


def add_statistics_flags(p: argparse.ArgumentParser) -> None:
    """The flags of `compare`'s verdicts: `--min-effect`, `--correction`, `--arms FILE`, `--aa POLICY`
    and `--trials T`."""
    from ..results.min_effect import CORRECTIONS, DEFAULT_CORRECTION, MIN_EFFECT

    defaults = ", ".join(f"{kind}={x:g}" for kind, x in MIN_EFFECT.items())
    p.add_argument("--min-effect", metavar="X|KIND=X,...",
                   help="with --seeds: the smallest relative difference a verdict may call better or worse, for every "
                   f"metric kind or per kind (latency, throughput, count, share; default {defaults})")
    p.add_argument("--correction", metavar="|".join(CORRECTIONS),
                   help="with --seeds: the family-wise error control over the table's verdicts: maxt (Westfall and "
                   "Young's step-down max-T over the draws' sign flips, using the metrics' correlation; needs 6 or more "
                   "draws at 95%%, else Holm), holm (Holm's step-down on the t-tests' p-values), none (each verdict's own "
                   f"interval); default {DEFAULT_CORRECTION}")
    p.add_argument("--arms", metavar="FILE",
                   help="compare arms that each set their own policy stack, engine config and cost model: a TOML file "
                   "of [arms.NAME] tables (EngineConfig fields, cost_model, cost_params), the first the baseline; "
                   "paired on the same draws (see metroline.core.experiments.arms); default: none (the policies of --policies)")
    p.add_argument("--aa", metavar="POLICY",
                   help="an A/A check: POLICY against itself, the arms differing only in their plugins' private "
                   "randomness (StepContext.salt), over --trials tables of --seeds draws; prints the false-verdict rates; default: none (no A/A)")
    p.add_argument("--trials", type=int, default=1, metavar="T",
                   help="with --aa: how many A/A tables, each on fresh draws and salts (default 1)")


def _check_seed_flags(args: argparse.Namespace, labels: list[str]) -> str:
    """The baseline of `--seeds` (`--baseline`, default the first policy), after checking the flags."""
    from ..results.min_effect import CORRECTIONS

    if args.seeds is not None and args.seeds < 2:
        raise ValueError(f"--seeds: must be at least 2 (an interval needs two draws), got {args.seeds}")
    if args.trials != 1 and args.aa is None:
        raise ValueError("--trials: applies with --aa only")
    if args.min_effect is not None and args.seeds is None:
        raise ValueError("--min-effect: applies with --seeds only")
    if args.correction is not None and args.seeds is None:
        raise ValueError("--correction: applies with --seeds only")
    if args.correction is not None and args.correction not in CORRECTIONS:
        raise ValueError(f"--correction: {args.correction!r} is not one of {', '.join(CORRECTIONS)}")
    if args.baseline is not None and args.seeds is None:
        raise ValueError("--baseline: applies with --seeds only")
    baseline = labels[0] if args.baseline is None else args.baseline
    if baseline not in labels:
        raise ValueError(f"--baseline: {baseline!r} is not one of {'--routers' if args.routers else '--policies'} ({', '.join(labels)})")
    if len(set(labels)) < len(labels) and args.seeds is not None:
        raise ValueError("--policies: a policy listed twice cannot be told apart in a comparison over seeds")
    return baseline


def cmd_compare(args: argparse.Namespace) -> int:
    """Run each policy of `--policies` on one workload (in parallel workers); print the comparison,
    and warn when the load is too light or too heavy for the policies to differ. With `--seeds K`,
    on K draws of the workload, and print the paired comparison (`metroline.core.results.paired`)."""
    from ..experiments.load_check import check
    from ..experiments.parallel import run_many
    from ..experiments.run_series import series_of
    from ..experiments.slo import evaluate, parse_slo
    from ..results import files as result_files
    from ..results import report
    from ..results.min_effect import DEFAULT_CORRECTION
    from ..results.multiplicity import parse_min_effect
    from ..results.paired import format_paired_table, paired_comparison, report_documents

    refuse_run_flags(args)
    resolved = resolve_run(args, routers=True)
    config, run, fields = resolved.config, resolved.run, set(resolved.user_fields)
    if config.debug:
        log_to_stderr()
    check_output_paths(args)
    check_report_folder(args)
    bounds = parse_slo(args.slo) if args.slo else None
    if args.jobs is not None and args.jobs < 1:
        raise ValueError(f"--jobs: must be at least 1, got {args.jobs}")
    spec = resolved.cluster
    factories = None
    if args.arms is not None:
        from ..experiments.arms import arm_setups

        if args.policies is not None or args.routers is not None or args.aa is not None:
            raise ValueError("--arms: each arm names its own policy; give it without --policies, --routers or --aa")
        labels, configs, factories = arm_setups(args.arms, config, run)
        specs = [spec] * len(labels)
    elif args.aa is not None:
        labels, configs = aa_configs(args, config)
        specs = [spec] * 2
    elif args.routers:
        if args.policies is not None and len(args.policies.split(",")) > 1:
            raise ValueError("--routers: compare routers or policies, not both (give --policies one policy, or none "
                             "for the config's)")
        _, (base_config,) = policy_configs(args.policies or config.policy, config)
        labels, specs = router_specs(args.routers, spec)
        configs = [base_config] * len(labels)
    else:
        labels, configs = policy_configs(args.policies or ",".join(POLICIES), config)
        specs = [spec] * len(labels)
    baseline = _check_seed_flags(args, labels)
    if spec is not None:
        for c in {id(c): c for c in configs}.values():
            spec.plan(c)  # a bad pool config is reported before any run
    if spec is None and not resolved.names_workload:
        run["workload"] = DEFAULT_WORKLOAD
    min_effect = parse_min_effect(args.min_effect)
    correction = args.correction or DEFAULT_CORRECTION
    if args.seeds is None:
        seeds, workloads = None, [make_workload(run, workload_seed(config))]
    else:
        seeds, workloads = seed_workloads(run, workload_seed(config), args.seeds * args.trials)
    workload = workloads[0]
    executor = make_executor(run)  # a bad executor or cost model is reported before any worker starts
    jobs, extra = args.jobs, {"ray": args.ray}
    if getattr(executor, "kv_bytes_per_token", None) and spec is not None:
        raise ValueError("--replicas/--pools/[cluster]: a cluster is simulated (--executor sim); the torch executor "
                         "serves replicas with `metroline serve --replicas N`")
    if getattr(executor, "kv_bytes_per_token", None):
        # a real model: its KV geometry fits every config alike, and runs go one at a time (each
        # one's wall-clock timings must not share the cores with another)
        configs = [fit_config(c, executor, fields) for c in configs]
        jobs, extra = 1, {"vocab_size": executor.vocab_size}
    close = getattr(executor, "close", None)
    if close is not None:
        close()
    manifest = manifest_for(args, config, run, workload, configs)
    if seeds is not None:
        manifest["seeds"]["workload"] = seeds
    run_labels = labels if seeds is None else [f"{label}#{s}" for s in seeds for label in labels]
    runs = [(w, c, sp) for w in workloads for c, sp in zip(configs, specs)]
    if args.aa is not None:
        runs = aa_runs(runs, args.seeds)
    results = run_many(
        runs, (lambda: make_executor(run)) if factories is None else factories * len(workloads),
        extract=series_of, jobs=jobs,
        labels=run_labels, oracle_lengths=bool(run.get("oracle_lengths")), progress=args.progress,
        window_s=run.get("window", 60.0), measure=measurement(run), **extra,
    )
    docs, series = [doc for doc, _ in results], [s for _, s in results]
    if args.routers:
        for i, doc in enumerate(docs):
            doc["label"] = labels[i % len(labels)]
    if bounds:
        for doc, s in zip(docs, series):
            doc["slo"] = evaluate(s.records, bounds, doc["summary"]["duration_s"])
    n = len(labels)
    if seeds is None:
        if any("output_digests" in doc for doc in docs):  # deterministic on a real model
            from ..experiments.output_digests import compare_outputs, format_outputs_check, mark_documents

            mark_documents(docs)
            outputs_check = compare_outputs(labels, docs)
        report.print_comparison_table(docs)
        if any("output_digests" in doc for doc in docs):
            print(format_outputs_check(outputs_check), end="")
        if spec is not None:
            from .cluster_run import format_cluster

            for label, doc in zip(labels, docs):
                print(f"{label}: {format_cluster(doc)}", end="")
    load = check([s.load for s in series[:n]], labels)  # of the first draw
    warn(load)
    for label, c, doc, s in zip(labels, configs, docs[:n], series[:n]):
        warn_speculation(c, doc, s.load, label)
    result = {"runs": docs, "load_check": load, "manifest": manifest}
    if seeds is None and any("output_digests" in doc for doc in docs):
        result["outputs_check"] = outputs_check
    if args.aa is not None:
        from ..results.aa import aa_tables, false_verdict_rates, format_aa

        tables = aa_tables(docs, (labels[0], labels[1]), seeds, args.trials, min_effect, correction)
        result["aa"] = false_verdict_rates(tables, labels[1])
        result["comparisons"] = tables
        print(format_aa(args.aa, result["aa"]), end="")
    elif seeds is not None:
        by_policy = {label: docs[c::n] for c, label in enumerate(labels)}
        result["comparison"] = comparison = paired_comparison(by_policy, seeds, baseline, min_effect=min_effect,
                                                                     correction=correction)
        print(format_paired_table(comparison), end="")
    if args.json:
        result_files.write_json(args.json, result)
    if args.report:
        from ..ab_report import write_compare_report

        shown = result if seeds is None else {**result, "runs": report_documents(result["comparison"], docs[:n])}
        print(f"report: {write_compare_report(args.report, shown, labels, series[:n]) / 'report.html'}")
    return 0
