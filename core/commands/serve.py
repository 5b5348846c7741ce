"""`metroline serve`: the OpenAI-compatible HTTP server on the simulated or the torch executor."""

from __future__ import annotations

import argparse
import sys

from .options import fit_config, make_executor, resolve_options, user_fields


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve until interrupted."""
    from ..config import load_config_file
    from ..serving.server import make_engine, serve
    from ..serving.tenants import ServeConfig

    config, run = resolve_options(args)
    table = dict(load_config_file(args.config).get("serve", {})) if args.config else {}
    for key in ("model", "host", "port", "max_waiting", "ramp_s"):
        if getattr(args, key, None) is not None:
            table[key] = getattr(args, key)
    if table.get("model") is None and run.get("model") is not None:
        table["model"] = run["model"]
    serve_config = ServeConfig.model_validate(table)
    if (run.get("executor") or "sim") == "sim":
        from ...executors.realtime import RealtimeExecutor

        # --model only names what /v1/models lists: the stand-in tokens come from no model
        sim = {k: v for k, v in run.items() if k not in ("model", "dtype", "device", "kv_memory_gb")}
        executor = RealtimeExecutor(make_executor(sim))
    else:
        run.setdefault("model", serve_config.model)
        executor = make_executor(run)
        config = fit_config(config, executor, user_fields(args, config))
    print(f"metroline: serving {serve_config.model!r} on http://{serve_config.host}:{serve_config.port}", file=sys.stderr)
    serve(make_engine(config, executor), serve_config)
