"""`metroline run`: replay a workload under one policy, print its report, write the files asked for."""

from __future__ import annotations

import argparse

from .logs import log_to_stderr
from .options import check_output_paths, make_workload, measurement, prepare, workload_seed
from .outputs import check_report_folder, manifest_for, warn_speculation


def cmd_run(args: argparse.Namespace) -> int:
    """Run the workload under the policy of `args`; print the summary table."""
    from ..experiments.runner import run_workload
    from ..results import files as result_files
    from ..results import report

    resolved, config, executor = prepare(args)
    run = resolved.run
    if config.debug:
        log_to_stderr()
    check_output_paths(args)
    check_report_folder(args)
    workload = make_workload(run, workload_seed(config), getattr(executor, "tokenizer", None))
    manifest = manifest_for(args, config, run, workload) if args.json or args.report else None
    vocab = getattr(executor, "vocab_size", None)
    spec = resolved.cluster
    if spec is not None:
        from .cluster_run import run_cluster_command

        return run_cluster_command(args, config, run, workload, executor, manifest, spec)
    writer = None
    if args.outputs:
        from ..workloads.text_requests import OutputsWriter

        writer = OutputsWriter(args.outputs)
    try:
        doc, engine = run_workload(
            workload, config, executor, plugins=[writer] if writer else None,
            oracle_lengths=bool(run.get("oracle_lengths")), progress=args.progress, window_s=run.get("window", 60.0),
            measure=measurement(run), **({"vocab_size": vocab} if vocab else {}),
        )
    except BaseException as exc:
        if writer is not None:
            writer.abandon(exc)
        raise
    if writer is not None:
        writer.close()
    if config.speculative_config is not None:
        from ..experiments.run_series import series_of

        warn_speculation(config, doc, series_of(engine, doc).load)
    engine.close()
    report.print_summary_table(doc)
    from ..results.deadlines import deadline_line

    line = deadline_line(doc.get("deadlines"))
    if line is not None:
        print(line)
    if manifest is not None:
        doc["manifest"] = manifest
    if args.json:
        result_files.write_json(args.json, doc)
    if args.report:
        from ..ab_report import write_compare_report
        from ..experiments.run_series import series_of

        result = {"runs": [doc], "manifest": doc.get("manifest")}
        label = doc["policy"]
        print(f"report: {write_compare_report(args.report, result, [label], [series_of(engine, doc)]) / 'report.html'}")
    if args.requests_csv:
        result_files.write_requests_csv(args.requests_csv, engine.metrics.requests)
    if args.steps_csv:
        m = engine.metrics
        tenants = sorted({r.tenant for r in m.requests})
        result_files.write_steps_csv(args.steps_csv, m.steps, m.running_by_tenant, tenants)
    return 0
