"""`metroline compare`: the same workload under several policies, side by side."""

from __future__ import annotations

import argparse
from typing import Any

from .flags import COMPARE_REFUSED
from .logs import log_to_stderr
from .options import check_output_paths, fit_config, make_executor, make_workload, resolve_options, user_fields
from .outputs import check_report_folder, manifest_for, warn

POLICIES = ("fcfs", "static", "priority", "srpt", "weighted_fair", "token_rr")
"""The shipped ordering policies: what `metroline compare` compares by default."""


def _own_options(configs: list[Any]) -> list[Any]:
    """Give each compared run the plugin options of the plugins it loads (a config file may hold
    options for a plugin only some runs stack); an option table no run loads is an error."""
    from ..plugins import plugin_name, resolve

    loaded = []
    for c in configs:
        names = set()
        for spec in [c.policy, *c.plugins]:
            names.add(spec)
            try:
                names.add(plugin_name(resolve(spec), spec))
            except Exception:  # noqa: BLE001 - a bad spec is reported by its run, with the policy named
                pass
        loaded.append(names)
    stray = sorted(set(configs[0].plugin_options) - set().union(*loaded))
    if stray:
        raise ValueError(f"plugin_options.{stray[0]}: no compared run loads plugin {stray[0]!r}")
    return [c.model_copy(update={"plugin_options": {k: v for k, v in c.plugin_options.items() if k in names}})
            for c, names in zip(configs, loaded)]


def policy_configs(policies: str, config: Any) -> tuple[list[str], list[Any]]:
    """The labels of `--policies` (`a+b` stacks plugin b on policy a) and a config for each, with
    the plugin options of the plugins it loads."""
    labels = [p.strip() for p in policies.split(",") if p.strip()]
    if not labels:
        raise ValueError("--policies: give at least one policy")
    configs = []
    for label in labels:
        policy, *stacked = label.split("+")
        configs.append(config.model_copy(update={"policy": policy, "plugins": [*stacked, *config.plugins]}))
    return labels, _own_options(configs)


def refuse_run_flags(args: argparse.Namespace) -> None:
    """Refuse the flags of `run` that a command of several policies does not take (`COMPARE_REFUSED`)."""
    for key, why in COMPARE_REFUSED.items():
        if getattr(args, key, None) is not None:
            raise ValueError(f"--{key.replace('_', '-')}: {why}")


def cmd_compare(args: argparse.Namespace) -> int:
    """Run each policy of `--policies` on one workload (in parallel workers); print the comparison,
    and warn when the load is too light or too heavy for the policies to differ."""
    from .. import report, result_files
    from ..load_check import check
    from ..run_series import series_of
    from ..runner import run_many
    from ..slo import evaluate, parse_slo

    refuse_run_flags(args)
    config, run = resolve_options(args)
    if config.debug:
        log_to_stderr()
    fields = user_fields(args, config)
    check_output_paths(args)
    check_report_folder(args)
    bounds = parse_slo(args.slo) if args.slo else None
    workload = make_workload(run, config.seed)
    if args.jobs is not None and args.jobs < 1:
        raise ValueError(f"--jobs: must be at least 1, got {args.jobs}")
    labels, configs = policy_configs(args.policies, config)
    executor = make_executor(run)  # a bad executor or cost model is reported before any worker starts
    jobs, extra = args.jobs, {"ray": args.ray}
    if getattr(executor, "kv_bytes_per_token", None):
        # a real model: its KV geometry fits every config alike, and runs go one at a time (each
        # one's wall-clock timings must not share the cores with another)
        configs = [fit_config(c, executor, fields) for c in configs]
        jobs, extra = 1, {"vocab_size": executor.vocab_size}
    close = getattr(executor, "close", None)
    if close is not None:
        close()
    manifest = manifest_for(args, config, run, workload, configs)
    results = run_many(
        [(workload, c) for c in configs], lambda: make_executor(run), extract=series_of, jobs=jobs, labels=labels,
        oracle_lengths=bool(run.get("oracle_lengths")), progress=args.progress, window_s=run.get("window", 60.0),
        **extra,
    )
    docs, series = [doc for doc, _ in results], [s for _, s in results]
    if bounds:
        for doc, s in zip(docs, series):
            doc["slo"] = evaluate(s.records, bounds, doc["summary"]["duration_s"])
    report.print_comparison_table(docs)
    load = check([s.load for s in series], labels)
    warn(load)
    result = {"runs": docs, "load_check": load, "manifest": manifest}
    if args.json:
        result_files.write_json(args.json, result)
    if args.report:
        from ..ab_report import write_compare_report

        print(f"report: {write_compare_report(args.report, result, labels, series) / 'report.html'}")
    return 0
