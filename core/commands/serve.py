"""`metroline serve`: the OpenAI-compatible HTTP server on the simulated or the torch executor."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .options import fit_config, make_executor, resolve_options, user_fields

SERVE_KEYS = ("model", "host", "port", "max_waiting", "ramp_s", "buffer_tokens", "stall_timeout",
              "default_max_tokens", "drain_s", "cache_salt")
"""The `ServeConfig` fields a flag of `serve` sets (over the config file's `[serve]` table)."""


def serve_setup(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """(EngineConfig, ServeConfig, executor) from the config file and the flags."""
    from ..config import load_config_file
    from ..serving.tenants import ServeConfig

    config, run = resolve_options(args)
    table = dict(load_config_file(args.config).get("serve", {})) if args.config else {}
    for key in SERVE_KEYS:
        if getattr(args, key, None) is not None:
            table[key] = getattr(args, key)
    if table.get("model") is None and run.get("model") is not None:
        table["model"] = run["model"]
    serve_config = ServeConfig.model_validate(table)
    if (run.get("executor") or "sim") == "sim":
        from ...executors.realtime import RealtimeExecutor

        # --model only names what /v1/models lists: the stand-in tokens come from no model
        sim = {k: v for k, v in run.items() if k != "model"}  # --dtype and the like: an error there
        executor = RealtimeExecutor(make_executor(sim))
    else:
        run.setdefault("model", serve_config.model)
        executor = make_executor(run)
        config = fit_config(config, executor, user_fields(args, config))
    return config, serve_config, executor


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve until interrupted."""
    from ..serving.server import make_engine, serve

    config, serve_config, executor = serve_setup(args)
    print(f"metroline: serving {serve_config.model!r} on http://{serve_config.host}:{serve_config.port}", file=sys.stderr)
    serve(make_engine(config, executor), serve_config)
    return 0
