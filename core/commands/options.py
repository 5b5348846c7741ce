"""The options of a command: the `--config` file and the flags merged into an `EngineConfig` and
run options, the executor and the workload they name, and the checks made before a run.

`resolve_run` is the one pass from a command's flags to its run: it reads the `--config` file
once and resolves the file, the flags and the preset into a validated `RunSpec` (the engine
config, the run options, the cluster when one is asked for, which fields the user set). The
commands that run engines (`run`, `compare`, `sweep`, `serve`) take everything from it;
`resolve_options` and `cluster_options` are its parts for the commands that need one of them."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..config import ConfigError
from ..speculative_config import speculative_json

RUN_KEYS = (
    "workload", "executor", "cost_model", "step_time", "cost_params", "rate_scale", "length_scale",
    "max_requests", "groups", "oracle_lengths", "traces_dir", "window", "model", "dtype", "device",
    "kv_memory_gb", "threads", "warmup", "horizon", "resample",
)
"""Keys of a `--config` file's `[run]` table (the rest of the file is `EngineConfig`)."""

FLAGS = {"max_num_batched_tokens": "--max-batched-tokens", "enable_prefix_caching": "--no-prefix-sharing",
         "plugins": "--plugin", "cost_params": "--cost-param", "preemption_mode": "--preemption",
         "enable_chunked_prefill": "--no-chunked-prefill"}
"""Config keys whose flag is not `--` + the key with dashes."""


def flag_name(key: str) -> str:
    """The flag that sets config or run option `key`."""
    return FLAGS.get(key, "--" + key.replace("_", "-"))


def _parse_value(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


@dataclass(frozen=True)
class RunSpec:
    """A command's run, resolved once from its flags, its `--config` file and the preset
    (`resolve_run`): `config` (validated), `run` (the run options, validated, defaults filled in),
    `cluster` (the `ClusterSpec`, None for a single engine), `user_fields` (the config fields the
    user set, which a real executor's model must not override: `fit_config`), `file` (the config
    file's tables as read, `{}` without one) and `names_workload` (whether the user named a
    workload, by flag or in the file)."""

    config: Any
    run: dict[str, Any]
    cluster: Any
    user_fields: frozenset[str]
    file: dict[str, Any]
    names_workload: bool


def read_config_file(args: argparse.Namespace) -> dict[str, Any]:
    """The `--config` file's tables (`{}` without one)."""
    from ..config import load_config_file

    return load_config_file(args.config) if getattr(args, "config", None) else {}


def resolve_run(args: argparse.Namespace, routers: bool = False) -> RunSpec:
    """The one pass from `args` to a `RunSpec`: the config file read once, merged with the flags
    and the preset, validated; the cluster of its `[cluster]` table and the cluster flags
    (`routers`: `--routers` asks for one too). Errors name the flag or the file and the key."""
    file = read_config_file(args)
    config, run = _merge(args, file)
    named = getattr(args, "workload", None) is not None or (
        isinstance(file.get("run"), dict) and "workload" in file["run"])
    return RunSpec(config, run, _cluster(args, file, routers), frozenset(user_fields(args, config)), file, named)


def resolve_options(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """Merge defaults, the `--config` file and the flags into (EngineConfig, run options).
    A bad value raises `ValueError` naming the file or the flag and the key."""
    return _merge(args, read_config_file(args))


def _merge(args: argparse.Namespace, file: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """(EngineConfig, run options) of the config file's tables `file` and the flags of `args`."""
    from ..config import EngineConfig, RunOptions, preset_fields
    from ..diagnostics import validation_message

    fields: dict[str, Any] = {}
    run: dict[str, Any] = {}
    origin: dict[str, str] = {}  # key -> the file or the flag it came from
    source = str(args.config) if getattr(args, "config", None) else "config"
    if file:
        data = dict(file)
        table = data.pop("run", {})
        if not isinstance(table, dict):
            raise ConfigError(f"{source}: run: must be a table of run options (valid: {', '.join(RUN_KEYS)})")
        run.update(relative_to_file(table, Path(args.config)))
        data.pop("serve", None)  # the server's table (metroline serve)
        data.pop("cluster", None)  # the cluster's table (`cluster_options`)
        fields.update(data)
    for key in ("policy", "max_num_seqs", "max_num_batched_tokens", "max_prefill_chunk", "max_prefill_chunk_adaptive",
                "max_model_len",
                "block_size", "num_blocks", "swap_space_blocks", "preemption_mode", "seed", "debug", "preset",
                "deterministic"):
        value = getattr(args, key, None)
        if value is not None:
            fields[key] = value
            origin[key] = flag_name(key)
    if getattr(args, "plugin", None):
        listed = fields.get("plugins", [])
        if not isinstance(listed, list):
            raise ConfigError(f"{source}: plugins: must be a list of plugin specs, got {listed!r:.60}")
        fields["plugins"] = [*listed, *args.plugin]
    if getattr(args, "speculative_config", None):
        fields["speculative_config"] = speculative_json(args.speculative_config)
        origin["speculative_config"] = flag_name("speculative_config")
    if getattr(args, "no_prefix_sharing", None):
        fields["enable_prefix_caching"] = False
        origin["enable_prefix_caching"] = flag_name("enable_prefix_caching")
    if getattr(args, "no_chunked_prefill", None):
        fields["enable_chunked_prefill"] = False
        origin["enable_chunked_prefill"] = flag_name("enable_chunked_prefill")
    if fields.get("preset") is not None:
        preset_fields(fields["preset"])  # an unknown preset: one line naming the valid ones
    if fields.get("preemption_mode") == "swap" and "swap_space_blocks" not in fields:
        # swap needs host blocks: as many as the device pool unless given (an explicit 0 is refused)
        fields["swap_space_blocks"] = fields.get("num_blocks", EngineConfig.model_fields["num_blocks"].default)
        origin["swap_space_blocks"] = origin.get("num_blocks", source)
    for key in RUN_KEYS:
        value = getattr(args, key, None)
        if value is not None:
            run[key] = value
            origin[key] = flag_name(key)
    params = run.get("cost_params") or {}
    if not isinstance(params, dict):
        raise ConfigError(f"{source}: run: cost_params: must be a table of cost model parameters, got {params!r:.60}")
    params = dict(params)
    for item in getattr(args, "cost_param", None) or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--cost-param: {item!r}: expected KEY=VALUE")
        params[key] = _parse_value(value)
        origin["cost_params"] = flag_name("cost_params")
    run["cost_params"] = params

    def where(key: str) -> str:
        return origin.get(key, source)

    try:
        options = RunOptions.model_validate(run).model_dump()
    except ValidationError as exc:
        raise ConfigError(validation_message(exc, lambda k: where(k) if k in origin else f"{source}: run", RunOptions)) from None
    if options["step_time"] is not None:
        options["cost_params"]["step_time"] = options["step_time"]
        if "cost_model" not in run:  # a step time names the steps cost model, not the default's
            options["cost_model"] = "steps"
    try:
        config = EngineConfig.model_validate(fields)
    except ValidationError as exc:
        raise ConfigError(validation_message(exc, where, EngineConfig)) from None
    return config, options


def relative_to_file(table: dict[str, Any], config_path: Path) -> dict[str, Any]:
    """The `[run]` table of the config file at `config_path` with its relative paths (a workload
    file, the traces folder, a cost model's `path` parameter) taken from the file's folder, not
    the working directory; a built-in workload name stays a name."""
    from ..workloads.generators import BUILTIN_WORKLOADS

    folder = config_path.parent

    def resolved(value: Any) -> Any:
        if isinstance(value, str) and value and value not in BUILTIN_WORKLOADS and not Path(value).is_absolute():
            return str(folder / value)
        return value

    table = dict(table)
    for key in ("workload", "traces_dir"):
        if key in table:
            table[key] = resolved(table[key])
    params = table.get("cost_params")
    if isinstance(params, dict) and "path" in params:
        table["cost_params"] = {**params, "path": resolved(params["path"])}
    return table


def check_output_paths(args: argparse.Namespace) -> None:
    """Refuse, before a run, an output file whose folder does not exist (a typo in a path would
    otherwise be found only after the run, or silently create a folder), and a path where something
    other than a regular file is (a symbolic link, a FIFO, a device: `files.not_regular`)."""
    from ..results.files import not_regular

    for flag in ("json", "requests_csv", "steps_csv", "outputs"):
        path = getattr(args, flag, None)
        if path is None:
            continue
        parent = Path(path).parent
        if not parent.is_dir():
            raise ConfigError(f"--{flag.replace('_', '-')}: {path}: the folder {parent} does not exist")
        if Path(path).is_dir():
            raise ConfigError(f"--{flag.replace('_', '-')}: {path} is a folder, not a file")
        kind = not_regular(path)
        if kind is not None:  # a result replaces its file whole: it would replace this
            raise ConfigError(f"--{flag.replace('_', '-')}: {path} is {kind}; results are written only to a "
                              "regular file or a new path")


def make_executor(run: dict[str, Any]) -> Any:
    """The executor the run options name (`executor`, default `sim`) with its options."""
    from ...executors.registry import make_executor as build

    name = run.get("executor") or "sim"
    if name == "sim":
        for key in ("model", "dtype", "device", "kv_memory_gb", "threads"):
            if run.get(key) is not None:
                raise ValueError(f"--{key.replace('_gb', '').replace('_', '-')} applies to --executor torch, not sim")
        return build("sim", cost_model=run.get("cost_model", "roofline"), cost_params=run.get("cost_params"))
    options = {k: run[k] for k in ("model", "dtype", "device", "kv_memory_gb", "threads") if run.get(k) is not None}
    return build(name, **options)


def fit_config(config: Any, executor: Any, user_fields: set[str]) -> Any:
    """A real executor's model sets what the user left open: the pool size from its KV budget
    (`suggest_num_blocks`) and `max_model_len` from its context length."""
    update: dict[str, Any] = {}
    suggest = getattr(executor, "suggest_num_blocks", None)
    if suggest is not None and "num_blocks" not in user_fields:
        spec = getattr(config, "speculative_config", None)  # a draft model's KV shares the pool
        update["num_blocks"] = suggest(config.block_size) if spec is None else suggest(
            config.block_size, speculative_config=spec)
    model_len = getattr(executor, "max_model_len", None)
    if model_len and "max_model_len" not in user_fields:
        update["max_model_len"] = model_len
    if update and config.preemption_mode == "swap" and "swap_space_blocks" not in user_fields:
        update["swap_space_blocks"] = update.get("num_blocks", config.num_blocks)
    return config.model_validate({**config.model_dump(), **update}) if update else config


def user_fields(args: argparse.Namespace, config: Any) -> set[str]:
    """The config fields the user set (a flag or the config file), not those filled in for them."""
    fields = set(config.model_fields_set)
    if getattr(args, "swap_space_blocks", None) is None and not getattr(args, "config", None):
        fields.discard("swap_space_blocks")  # resolve_options sized it after the default pool
    return fields


def prepare(args: argparse.Namespace) -> tuple[RunSpec, Any, Any]:
    """(the `RunSpec`, its config fitted to a real executor's model, the executor) for `run`."""
    spec = resolve_run(args)
    run = spec.run
    executor = make_executor(run)
    config = fit_config(spec.config, executor, spec.user_fields)
    if getattr(executor, "kv_bytes_per_token", None):
        print(
            f"executor {executor.name}: {config.num_blocks} KV blocks x {config.block_size} tokens = "
            f"{config.max_kv_tokens} tokens ({_pool_bytes(executor, config)} bytes/token), "
            f"max_model_len {config.max_model_len}"
        )
    return spec, config, executor


def _pool_bytes(executor: Any, config: Any) -> int:
    """Bytes of KV per pool slot: the target's, and a draft model's when it shares the pool."""
    pool_bytes = getattr(executor, "pool_bytes_per_token", None)
    return executor.kv_bytes_per_token if pool_bytes is None else pool_bytes(config.speculative_config)


def workload_seed(config: Any) -> int | None:
    """The seed the user gave (`--seed`, or `seed` in the config file), None when none was: then a
    spec file keeps its own seed and a trace is replayed as recorded."""
    return config.seed if "seed" in config.model_fields_set else None


def make_workload(run: dict[str, Any], seed: int | None, tokenizer: Any = None) -> Any:
    """The workload the run options name (default: the chat built-in), built with `seed` (see
    `workload_seed`; a trace is resampled by the `resample` option when a seed is given)."""
    from ..workloads.build import build_workload

    return build_workload(
        run.get("workload", "chat"), seed=seed, rate_scale=run.get("rate_scale", 1.0),
        length_scale=run.get("length_scale", 1.0), max_requests=run.get("max_requests"),
        groups=run.get("groups"), traces_dir=run.get("traces_dir"), tokenizer=tokenizer,
        resample=run.get("resample", "redraw"),
    )


def cluster_options(args: argparse.Namespace, routers: bool = False) -> Any:
    """The `ClusterSpec` of the config file's `[cluster]` table and the flags `--replicas`,
    `--pools`, `--router`, `--router-option` (None when neither the table nor a flag asks for a
    cluster). `routers`: `--routers` (compare) also asks for one."""
    return _cluster(args, read_config_file(args), routers)


def _cluster(args: argparse.Namespace, file: dict[str, Any], routers: bool) -> Any:
    """`cluster_options` of the config file's tables `file`. A single engine (no table, no cluster
    flag) returns None without loading the cluster code."""
    table = None
    if getattr(args, "config", None):
        table = file.get("cluster")
        if table is not None and not isinstance(table, dict):
            raise ConfigError(f"{args.config}: cluster: must be a table (replicas, pools, router, router_options)")
    wanted = routers and getattr(args, "routers", None)
    if table is None and not wanted and not any(
            getattr(args, key, None) for key in ("replicas", "pools", "router", "router_option")):
        return None
    from ..cluster.spec import cluster_spec, parse_pools, parse_router_options

    flags = {"replicas": getattr(args, "replicas", None), "pools": parse_pools(getattr(args, "pools", None)),
             "router": getattr(args, "router", None),
             "router_options": parse_router_options(getattr(args, "router_option", None))}
    if table is None and not wanted and not any(flags.values()):
        return None
    return cluster_spec(table, source=str(getattr(args, "config", None) or "config"), **flags)


def measurement(run: dict[str, Any]) -> Any:
    """The measurement window of the `warmup` and `horizon` run options (None when neither is set)."""
    from ..results.horizon import MeasurementWindow

    warmup, horizon = run.get("warmup") or 0.0, run.get("horizon")
    if not warmup and horizon is None:
        return None
    return MeasurementWindow(warmup, horizon)
