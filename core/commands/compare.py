"""`metroline compare`: the same workload under several policies, side by side."""

from __future__ import annotations

import argparse
from typing import Any

from .flags import COMPARE_REFUSED
from .logs import log_to_stderr
from .options import check_output_paths, fit_config, make_executor, make_workload, resolve_options, user_fields

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


def cmd_compare(args: argparse.Namespace) -> int:
    """Run each policy of `--policies` on one workload (in parallel workers); print the comparison."""
    from .. import report, result_files
    from ..runner import run_workloads

    for key, why in COMPARE_REFUSED.items():
        if getattr(args, key, None) is not None:
            raise ValueError(f"--{key.replace('_', '-')}: {why}")
    config, run = resolve_options(args)
    if config.debug:
        log_to_stderr()
    fields = user_fields(args, config)
    check_output_paths(args)
    workload = make_workload(run, config.seed)
    labels = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not labels:
        raise ValueError("--policies: give at least one policy")
    if args.jobs is not None and args.jobs < 1:
        raise ValueError(f"--jobs: must be at least 1, got {args.jobs}")
    configs = []
    for label in labels:
        policy, *stacked = label.split("+")
        configs.append(config.model_copy(update={"policy": policy, "plugins": [*stacked, *config.plugins]}))
    configs = _own_options(configs)
    executor = make_executor(run)  # a bad executor or cost model is reported before any worker starts
    jobs, extra = args.jobs, {}
    if getattr(executor, "kv_bytes_per_token", None):
        # a real model: its KV geometry fits every config alike, and runs go one at a time (each
        # one's wall-clock timings must not share the cores with another)
        configs = [fit_config(c, executor, fields) for c in configs]
        jobs, extra = 1, {"vocab_size": executor.vocab_size}
    close = getattr(executor, "close", None)
    if close is not None:
        close()
    docs = run_workloads(
        workload, configs, lambda: make_executor(run), jobs=jobs, labels=labels,
        oracle_lengths=bool(run.get("oracle_lengths")), progress=args.progress, window_s=run.get("window", 60.0),
        **extra,
    )
    report.print_comparison_table(docs)
    if args.json:
        result_files.write_json(args.json, {"runs": docs})
    return 0
