"""`metroline serve`: the OpenAI-compatible HTTP server on the simulated or the torch executor."""

from __future__ import annotations

import argparse
import secrets
import sys
from typing import Any

from .options import fit_config, make_executor, read_config_file, resolve_run

SERVE_KEYS = ("model", "host", "port", "max_waiting", "ramp_s", "buffer_tokens", "buffer_bytes", "stall_timeout",
              "default_max_tokens", "drain_s", "cache_salt", "max_body_bytes", "public_metrics", "hook_budget_s")
"""The `ServeConfig` fields a flag of `serve` sets (over the config file's `[serve]` table)."""


def serve_config_of(args: argparse.Namespace, run: dict[str, Any], file: dict[str, Any]) -> Any:
    """The `ServeConfig` of the config file's `[serve]` table (in its tables `file`) and the flags."""
    from ..serving.tenants import ServeConfig

    table = dict(file.get("serve", {}))
    for key in SERVE_KEYS:
        if getattr(args, key, None) is not None:
            table[key] = getattr(args, key)
    if table.get("model") is None and run.get("model") is not None:
        table["model"] = run["model"]
    return ServeConfig.model_validate(table)


def serve_setup(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """(EngineConfig, ServeConfig, executor) from the config file and the flags."""
    resolved = resolve_run(args)
    config, run = resolved.config, resolved.run
    serve_config = serve_config_of(args, run, resolved.file)
    if (run.get("executor") or "sim") == "sim":
        from ...executors.realtime import RealtimeExecutor

        # --model only names what /v1/models lists: the stand-in tokens come from no model
        sim = {k: v for k, v in run.items() if k != "model"}  # --dtype and the like: an error there
        executor = RealtimeExecutor(make_executor(sim))
    else:
        run.setdefault("model", serve_config.model)
        executor = make_executor(run)
        config = fit_config(config, executor, resolved.user_fields)
    return config, serve_config, executor


class ReplicaSetup:
    """`serve_setup(args)` of one replica, with its engine's `changes` (its pool's and canary's
    config and policy stack) applied over the top-level config (picklable: replicas are spawned)."""

    def __init__(self, changes: dict[str, Any], front_key: str | None = None) -> None:
        self.changes = changes
        self.front_key = front_key
        """An operator key of the replica's, which only the front knows: it reads the replica's
        `/v1/replica/state` with it."""

    def __call__(self, args: argparse.Namespace) -> tuple[Any, Any, Any]:
        config, serve_config, executor = serve_setup(args)
        if self.front_key is not None:
            serve_config = serve_config.model_copy(
                update={"operator_keys": [*serve_config.operator_keys, self.front_key]})
        if self.changes:
            config = config.model_validate({**config.model_dump(), **self.changes})
        return config, serve_config, executor


def with_replicas(args: argparse.Namespace) -> bool:
    """Whether `serve` runs several replicas behind a front (`--replicas`, `--pools`, `--ray` or a
    `[cluster]` table in the config file)."""
    return bool(getattr(args, "replicas", None) or getattr(args, "pools", None)
                or getattr(args, "ray", None) is not None or "cluster" in read_config_file(args))


def front_tokenizer(run: dict[str, Any], model: str) -> Any:
    """The tokenizer the front routes with: the model's own when it has one (the torch executor),
    else the simulated stand-ins."""
    from ..serving.tokens import HFTokenizer, StandInTokenizer

    if (run.get("executor") or "sim") == "sim":
        return StandInTokenizer()
    try:
        from transformers import AutoTokenizer

        from ...executors.torch.loader import locate

        path = locate(run.get("model") or model)
        tok = (AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name) if path.is_file()
               else AutoTokenizer.from_pretrained(path))
    except (OSError, ValueError, ImportError):
        return StandInTokenizer()  # a model folder without a tokenizer: the replicas use these too
    return HFTokenizer(tok)


def front_setup(args: argparse.Namespace, start_timeout: float = 300.0) -> tuple[Any, Any]:
    """(front app, ServeConfig): the replicas of `--replicas`/`--pools` started (local processes,
    or Ray actors with `--ray`), each serving `serve_setup(args)`, behind `--router`. The app stops
    them when its lifespan ends."""
    from ..cluster.router import make_router
    from ..cluster.spec import ClusterSpec
    from ..serving.front import build_front
    from ..serving.quota import quota_of_config
    from ..serving.replicas import start_local, stop_all
    if args.replicas is not None and args.replicas < 1:
        raise ValueError(f"--replicas: expected at least 1, got {args.replicas}")
    resolved = resolve_run(args)  # a bad flag is said here, before any replica starts
    config, run = resolved.config, resolved.run
    spec = resolved.cluster or ClusterSpec(replicas=1)
    plans = spec.plan(config)  # and a bad pool config
    router = make_router(spec.router, spec.router_options)
    serve_config = serve_config_of(args, run, resolved.file)
    top = config.model_dump()
    front_key = secrets.token_urlsafe(32)  # the front's own operator key at its replicas (their state)
    builds = [ReplicaSetup({k: v for k, v in p.config.model_dump().items() if v != top[k]}, front_key) for p in plans]
    specs = [(p.name, p.pool) for p in plans]
    if args.ray is not None:
        from ..serving.ray_replicas import start_ray

        replicas = start_ray(specs, builds, args, args.ray, start_timeout=start_timeout)
    else:
        replicas = start_local(specs, builds, args, start_timeout=start_timeout)
    try:
        tokenizer = front_tokenizer(run, serve_config.model)
        stop = lambda rs: stop_all(rs, timeout=serve_config.drain_s + 5)
        return build_front(replicas, router, serve_config, tokenizer, stop_replicas=stop,
                           cluster=(spec, plans), replica_key=front_key, quota=quota_of_config(config),
                           max_model_len=config.max_model_len), serve_config
    except BaseException:
        stop_all(replicas)
        raise


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve until interrupted."""
    from ..serving.server import make_engine, serve

    if with_replicas(args):
        return cmd_serve_replicas(args)
    config, serve_config, executor = serve_setup(args)

    def listening(port: int) -> None:  # the bound port: the system's choice for --port 0
        print(f"metroline: serving {serve_config.model!r} on http://{serve_config.host}:{port}", file=sys.stderr,
              flush=True)

    serve(make_engine(config, executor), serve_config, on_stop=print_summary, on_listen=listening)
    return 0


def print_summary(server: Any) -> None:
    """What `serve` prints once drained: the share of the requests that carried a `deadline_s`
    that met it, overall and per tenant (nothing when none did)."""
    from ..results.deadlines import deadline_line

    line = deadline_line(server.metrics.deadline_figures())
    if line is not None:
        print(f"metroline: {line}", file=sys.stderr, flush=True)


def cmd_serve_replicas(args: argparse.Namespace) -> int:
    """Serve the front of `--replicas`/`--pools` until interrupted; the replicas are stopped with it."""
    from ..serving.replicas import stop_all
    from ..serving.server import serve_app

    app, serve_config = front_setup(args)
    front = app.state.front
    names = ", ".join(f"{r.name} ({r.pool}) {r.url}" for r in front.replicas)

    def listening(port: int) -> None:  # the bound port: the system's choice for --port 0
        print(f"metroline: serving {serve_config.model!r} on http://{serve_config.host}:{port}, router "
              f"{'+'.join(front.router.names)} over {len(front.replicas)} replicas: {names}", file=sys.stderr,
              flush=True)

    try:
        serve_app(app, serve_config, on_listen=listening)
    finally:
        stop_all(front.replicas, timeout=serve_config.drain_s + 5)  # stopped already unless uvicorn failed
    return 0
