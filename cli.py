"""The `metroline` command: `run` a workload under a policy, `compare` policies, `generate` text with
a real model, `calibrate` the simulator against it, list `plugins` and `workloads`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, NoReturn

from pydantic import ValidationError

from .core.config import ConfigError

RUN_KEYS = (
    "workload", "executor", "cost_model", "step_time", "cost_params", "rate_scale", "length_scale",
    "max_requests", "groups", "oracle_lengths", "traces_dir", "window", "model", "dtype", "device",
    "kv_memory_gb",
)
"""Keys of a `--config` file's `[run]` table (the rest of the file is `EngineConfig`)."""

POLICIES = ("fcfs", "static", "priority", "srpt", "weighted_fair", "token_rr")
"""The shipped ordering policies: what `metroline compare` compares by default."""


FLAGS = {"max_num_batched_tokens": "--max-batched-tokens", "enable_prefix_caching": "--no-prefix-sharing",
         "plugins": "--plugin", "cost_params": "--cost-param", "preemption_mode": "--preemption"}
"""Config keys whose flag is not `--` + the key with dashes."""


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors in metroline's one-line style."""

    def error(self, message: str) -> NoReturn:
        if message.startswith("argument "):
            message = message[len("argument "):]
        self.exit(2, f"metroline: error: {message} (see {self.prog} --help)\n")


def _flag(key: str) -> str:
    return FLAGS.get(key, "--" + key.replace("_", "-"))


def _engine_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", help="base policy: a shipped name, an entry point or pkg.mod:Obj (default fcfs)")
    p.add_argument("--plugin", action="append", default=None, metavar="SPEC",
                   help="stack a plugin on the policy (repeatable; later ones take precedence)")
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--max-batched-tokens", type=int, dest="max_num_batched_tokens")
    p.add_argument("--max-prefill-chunk", type=int)
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--block-size", type=int)
    p.add_argument("--num-blocks", type=int)
    p.add_argument("--swap-space-blocks", type=int)
    p.add_argument("--no-prefix-sharing", action="store_true", default=None)
    p.add_argument("--preemption", choices=("recompute", "swap"), dest="preemption_mode")
    p.add_argument("--seed", type=int)
    p.add_argument("--preset", help="a bundle of scheduler options that reproduces a real engine "
                   "(vllm); explicit flags and config keys override it")
    p.add_argument("--config", metavar="PATH", help="TOML or JSON file of EngineConfig fields, plugin "
                   "options ([plugin_options.NAME]) and run options ([run]); flags override it")
    p.add_argument("--debug", action="store_true", default=None, help="log every request transition")


def _run_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", help="a built-in name (see `metroline workloads`) or a .csv/.jsonl/.toml/.json file")
    p.add_argument("--executor", help="sim: the simulated executor (default); torch: a Hugging Face model on "
                   "paged KV; or an entry point of metroline.executors, or pkg.mod:factory")
    p.add_argument("--model", help="torch executor: a model folder, a .gguf file or a known name (smollm2)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                   help="torch executor: weights and KV dtype (default float32 on CPU, bfloat16 on CUDA)")
    p.add_argument("--device", help="torch executor: cpu, cuda, cuda:N (default cuda when available)")
    p.add_argument("--kv-memory", type=float, dest="kv_memory_gb", metavar="GB",
                   help="torch executor: the KV budget that sizes the pool when --num-blocks is not given")
    p.add_argument("--cost-model", choices=("steps", "linear", "roofline", "calibrated"))
    p.add_argument("--step-time", type=float, help="seconds per step of the steps cost model (default 0.01)")
    p.add_argument("--cost-param", action="append", default=None, metavar="KEY=VALUE",
                   help="a cost model parameter, e.g. gpu=H100 or path=steps.csv (repeatable)")
    p.add_argument("--rate-scale", type=float)
    p.add_argument("--length-scale", type=float)
    p.add_argument("--max-requests", type=int)
    p.add_argument("--groups", type=int, help="number of groups of the mixed-64 workload")
    p.add_argument("--oracle-lengths", action="store_true", default=None,
                   help="let policies see each request's true output length (the results say so)")
    p.add_argument("--traces-dir", help="folder of the trace files (default: ../shared/traces)")
    p.add_argument("--window", type=float, metavar="S",
                   help="seconds per fairness window (default 60): whole-run totals hide unfairness")
    p.add_argument("--json", metavar="PATH", help="write the result document")
    p.add_argument("--requests-csv", metavar="PATH", help="write one row per request")
    p.add_argument("--steps-csv", metavar="PATH", help="write one row per step")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on stderr (default: when stderr is a terminal)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="metroline", description=__doc__)
    sub = parser.add_subparsers(dest="command")
    run = sub.add_parser("run", help="simulate a workload under a policy and print its metrics")
    _engine_flags(run)
    _run_flags(run)
    run.add_argument("--outputs", metavar="PATH", help="write one JSON line per finished sequence: id, "
                     "prompt_token_ids, output_token_ids, text (null without a tokenizer), finish_reason")
    compare = sub.add_parser("compare", help="run several policies on the identical workload, side by side")
    compare.add_argument("--policies", default=",".join(POLICIES),
                         help="comma-separated policies; `a+b` stacks plugin b on policy a "
                         f"(default: {','.join(POLICIES)})")
    compare.add_argument("--jobs", type=int, metavar="N",
                         help="worker processes running the policies in parallel (default: one per core; "
                         "1 runs them one by one here); the results do not depend on it")
    _engine_flags(compare)
    _run_flags(compare)
    plugins = sub.add_parser("plugins", help="list the loaded plugins and the hooks each implements")
    _engine_flags(plugins)
    sub.add_parser("workloads", help="list the built-in workloads")
    serve = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (see core/serving)")
    _engine_flags(serve)
    serve.add_argument("--model", help="the model to serve (with --executor sim: only the name /v1/models lists)")
    serve.add_argument("--executor", choices=("sim", "torch"), help="sim (default): the cost model in real time")
    serve.add_argument("--cost-model", choices=("steps", "linear", "roofline", "calibrated"))
    serve.add_argument("--step-time", type=float, help="seconds per step of the steps cost model (default 0.01)")
    serve.add_argument("--cost-param", action="append", default=None, metavar="KEY=VALUE")
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default 8000)")
    serve.add_argument("--max-waiting", type=int, help="answer 429 past this many waiting requests")
    serve.add_argument("--ramp-s", type=float, help="cold start: reach max_num_seqs in flight over this many seconds")
    generate = sub.add_parser("generate", help="generate text from prompts with a real model, streamed")
    _generate_flags(generate)
    calibrate = sub.add_parser("calibrate", help="time a real model over batch shapes and fit the simulator's "
                               "cost model to it (--cost-model calibrated --cost-param path=FILE)")
    _calibrate_flags(calibrate)
    return parser


def _model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2", help="a model folder, a .gguf file or a known name (default smollm2)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                   help="weights and KV dtype (default float32 on CPU, bfloat16 on CUDA)")
    p.add_argument("--device", help="cpu, cuda, cuda:N (default cuda when available)")
    p.add_argument("--kv-memory", type=float, dest="kv_memory_gb", metavar="GB",
                   help="the KV budget that sizes the pool when --num-blocks is not given")
    p.add_argument("--num-blocks", type=int)
    p.add_argument("--block-size", type=int)


def _generate_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompts", nargs="+", metavar="PROMPT", help="one or more prompts (run as one batch)")
    _model_flags(p)
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate per prompt (default 64)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 (the default) is greedy")
    p.add_argument("--top-p", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--min-p", type=float)
    p.add_argument("--seed", type=int, help="per-request sampling seed: the same tokens whatever the batch")
    p.add_argument("--stop", action="append", metavar="TEXT", help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at the end-of-sequence token")
    p.add_argument("--chat", action="store_true", help="apply the tokenizer's chat template (the prompt is the user turn)")


def _calibrate_flags(p: argparse.ArgumentParser) -> None:
    _model_flags(p)
    p.add_argument("--out", default="calibrated.json", metavar="FILE",
                   help="where the fitted cost model goes (default calibrated.json)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs of each batch shape (default 3; the median counts)")
    p.add_argument("--quick", action="store_true", help="a smaller sweep (for a first look or a test)")


def _parse_value(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def resolve_options(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """Merge defaults, the `--config` file and the flags into (EngineConfig, run options).
    A bad value raises `ValueError` naming the file or the flag and the key."""
    from .core.config import EngineConfig, RunOptions, load_config_file, preset_fields
    from .core.diagnostics import validation_message

    fields: dict[str, Any] = {}
    run: dict[str, Any] = {}
    origin: dict[str, str] = {}  # key -> the file or the flag it came from
    source = str(args.config) if getattr(args, "config", None) else "config"
    if getattr(args, "config", None):
        data = load_config_file(args.config)
        table = data.pop("run", {})
        if not isinstance(table, dict):
            raise ConfigError(f"{source}: run: must be a table of run options (valid: {', '.join(RUN_KEYS)})")
        run.update(table)
        data.pop("serve", None)  # the server's table (metroline serve)
        fields.update(data)
    for key in ("policy", "max_num_seqs", "max_num_batched_tokens", "max_prefill_chunk", "max_model_len",
                "block_size", "num_blocks", "swap_space_blocks", "preemption_mode", "seed", "debug", "preset"):
        value = getattr(args, key, None)
        if value is not None:
            fields[key] = value
            origin[key] = _flag(key)
    if getattr(args, "plugin", None):
        listed = fields.get("plugins", [])
        if not isinstance(listed, list):
            raise ConfigError(f"{source}: plugins: must be a list of plugin specs, got {listed!r:.60}")
        fields["plugins"] = [*listed, *args.plugin]
    if getattr(args, "no_prefix_sharing", None):
        fields["enable_prefix_caching"] = False
        origin["enable_prefix_caching"] = _flag("enable_prefix_caching")
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
            origin[key] = _flag(key)
    params = run.get("cost_params") or {}
    if not isinstance(params, dict):
        raise ConfigError(f"{source}: run: cost_params: must be a table of cost model parameters, got {params!r:.60}")
    params = dict(params)
    for item in getattr(args, "cost_param", None) or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--cost-param: {item!r}: expected KEY=VALUE")
        params[key] = _parse_value(value)
        origin["cost_params"] = _flag("cost_params")
    run["cost_params"] = params

    def where(key: str) -> str:
        return origin.get(key, source)

    try:
        options = RunOptions.model_validate(run).model_dump()
    except ValidationError as exc:
        raise ConfigError(validation_message(exc, lambda k: where(k) if k in origin else f"{source}: run", RunOptions)) from None
    if options["step_time"] is not None:
        options["cost_params"]["step_time"] = options["step_time"]
    try:
        config = EngineConfig.model_validate(fields)
    except ValidationError as exc:
        raise ConfigError(validation_message(exc, where, EngineConfig)) from None
    return config, options


def check_output_paths(args: argparse.Namespace) -> None:
    """Refuse, before a run, an output file whose folder does not exist (a typo in a path would
    otherwise be found only after the run, or silently create a folder)."""
    for flag in ("json", "requests_csv", "steps_csv"):
        path = getattr(args, flag, None)
        if path is None:
            continue
        parent = Path(path).parent
        if not parent.is_dir():
            raise ConfigError(f"--{flag.replace('_', '-')}: {path}: the folder {parent} does not exist")
        if Path(path).is_dir():
            raise ConfigError(f"--{flag.replace('_', '-')}: {path} is a folder, not a file")


def make_executor(run: dict[str, Any]) -> Any:
    """The executor the run options name (`executor`, default `sim`) with its options."""
    from .executors.registry import make_executor as build

    name = run.get("executor") or "sim"
    if name == "sim":
        for key in ("model", "dtype", "device", "kv_memory_gb"):
            if run.get(key) is not None:
                raise ValueError(f"--{key.replace('_gb', '').replace('_', '-')} applies to --executor torch, not sim")
        return build("sim", cost_model=run.get("cost_model", "steps"), cost_params=run.get("cost_params"))
    options = {k: run[k] for k in ("model", "dtype", "device", "kv_memory_gb") if run.get(k) is not None}
    return build(name, **options)


def fit_config(config: Any, executor: Any, user_fields: set[str]) -> Any:
    """A real executor's model sets what the user left open: the pool size from its KV budget
    (`suggest_num_blocks`) and `max_model_len` from its context length."""
    update: dict[str, Any] = {}
    suggest = getattr(executor, "suggest_num_blocks", None)
    if suggest is not None and "num_blocks" not in user_fields:
        update["num_blocks"] = suggest(config.block_size)
    model_len = getattr(executor, "max_model_len", None)
    if model_len and "max_model_len" not in user_fields:
        update["max_model_len"] = model_len
    if update and config.preemption_mode == "swap" and "swap_space_blocks" not in user_fields:
        update["swap_space_blocks"] = update.get("num_blocks", config.num_blocks)
    return config.model_validate({**config.model_dump(), **update}) if update else config


def _user_fields(args: argparse.Namespace, config: Any) -> set[str]:
    """The config fields the user set (a flag or the config file), not those filled in for them."""
    fields = set(config.model_fields_set)
    if getattr(args, "swap_space_blocks", None) is None and not getattr(args, "config", None):
        fields.discard("swap_space_blocks")  # resolve_options sized it after the default pool
    return fields


def _prepare(args: argparse.Namespace) -> tuple[Any, dict[str, Any], Any]:
    """(config, run options, executor) for `run`, the config fitted to a real executor's model."""
    config, run = resolve_options(args)
    executor = make_executor(run)
    config = fit_config(config, executor, _user_fields(args, config))
    if getattr(executor, "kv_bytes_per_token", None):
        print(
            f"executor {executor.name}: {config.num_blocks} KV blocks x {config.block_size} tokens = "
            f"{config.max_kv_tokens} tokens ({executor.kv_bytes_per_token} bytes/token), "
            f"max_model_len {config.max_model_len}"
        )
    return config, run, executor


def make_workload(run: dict[str, Any], seed: int, tokenizer: Any = None) -> Any:
    from .core.workloads import build_workload

    return build_workload(
        run.get("workload", "chat"), seed=seed, rate_scale=run.get("rate_scale", 1.0),
        length_scale=run.get("length_scale", 1.0), max_requests=run.get("max_requests"),
        groups=run.get("groups"), traces_dir=run.get("traces_dir"), tokenizer=tokenizer,
    )


def cmd_run(args: argparse.Namespace) -> int:
    from .core import report
    from .core.runner import run_workload

    config, run, executor = _prepare(args)
    check_output_paths(args)
    workload = make_workload(run, config.seed, getattr(executor, "tokenizer", None))
    vocab = getattr(executor, "vocab_size", None)
    writer = None
    if args.outputs:
        from .core.text_requests import OutputsWriter

        writer = OutputsWriter(args.outputs)
    try:
        doc, engine = run_workload(
            workload, config, executor, plugins=[writer] if writer else None,
            oracle_lengths=bool(run.get("oracle_lengths")), progress=args.progress, window_s=run.get("window", 60.0),
            **({"vocab_size": vocab} if vocab else {}),
        )
    finally:
        if writer is not None:
            writer.close()
    engine.close()
    print(report.format_summary_table(doc))
    if args.json:
        report.write_json(args.json, doc)
    if args.requests_csv:
        report.write_requests_csv(args.requests_csv, engine.metrics.requests)
    if args.steps_csv:
        report.write_steps_csv(args.steps_csv, engine.metrics.steps)
    return 0


def _own_options(configs: list[Any]) -> list[Any]:
    """Give each compared run the plugin options of the plugins it loads (a config file may hold
    options for a plugin only some runs stack); an option table no run loads is an error."""
    from .core.plugins import plugin_name, resolve

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
    from .core import report
    from .core.parallel import run_workloads

    config, run = resolve_options(args)
    user_fields = _user_fields(args, config)
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
        configs = [fit_config(c, executor, user_fields) for c in configs]
        jobs, extra = 1, {"vocab_size": executor.vocab_size}
    close = getattr(executor, "close", None)
    if close is not None:
        close()
    docs = run_workloads(
        workload, configs, lambda: make_executor(run), jobs=jobs, labels=labels,
        oracle_lengths=bool(run.get("oracle_lengths")), progress=args.progress, window_s=run.get("window", 60.0),
        **extra,
    )
    print(report.format_comparison_table(docs))
    if args.json:
        report.write_json(args.json, {"runs": docs})
    return 0


def cmd_plugins(args: argparse.Namespace) -> int:
    from importlib.metadata import entry_points

    from .core.plugins import ENTRY_POINT_GROUP, SHIPPED, PluginManager

    config, _ = resolve_options(args)
    manager = PluginManager(config)
    print("loaded plugins (highest precedence first):")
    for name, hooks in manager.describe():
        print(f"  {name:<16} {', '.join(hooks)}")
    print("shipped:", ", ".join(SHIPPED))
    eps = [f"{ep.name} ({ep.value})" for ep in entry_points(group=ENTRY_POINT_GROUP)]
    print("entry points:", ", ".join(eps) if eps else "none")
    return 0


def cmd_workloads(args: argparse.Namespace) -> int:
    from .core.workloads import BUILTIN_WORKLOADS

    for name, description in BUILTIN_WORKLOADS.items():
        print(f"{name:<14} {description}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from .core.config import load_config_file
    from .core.serving.server import make_engine, serve
    from .core.serving.tenants import ServeConfig

    config, run = resolve_options(args)
    table = dict(load_config_file(args.config).get("serve", {})) if args.config else {}
    for key in ("model", "host", "port", "max_waiting", "ramp_s"):
        if getattr(args, key, None) is not None:
            table[key] = getattr(args, key)
    if table.get("model") is None and run.get("model") is not None:
        table["model"] = run["model"]
    serve_config = ServeConfig.model_validate(table)
    if (run.get("executor") or "sim") == "sim":
        from .executors.realtime import RealtimeExecutor

        # --model only names what /v1/models lists: the stand-in tokens come from no model
        sim = {k: v for k, v in run.items() if k not in ("model", "dtype", "device", "kv_memory_gb")}
        executor = RealtimeExecutor(make_executor(sim))
    else:
        run.setdefault("model", serve_config.model)
        executor = make_executor(run)
        config = fit_config(config, executor, _user_fields(args, config))
    print(f"metroline: serving {serve_config.model!r} on http://{serve_config.host}:{serve_config.port}", file=sys.stderr)
    serve(make_engine(config, executor), serve_config)


def _encode(tokenizer: Any, prompt: str, chat: bool) -> list[int]:
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("--chat: the model's tokenizer has no chat template")
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                            tokenize=True)
        return list(ids if isinstance(ids, list) else ids["input_ids"])
    return list(tokenizer.encode(prompt))


class _TextStream:
    """The printable text of each sequence as its tokens arrive: the engine's incremental text
    (`out.text`) when it keeps one, else the whole output decoded again. Text that may still become
    a stop string, or ends in half a character, waits for the next token."""

    def __init__(self, tokenizer: Any, stop: tuple[str, ...]) -> None:
        self.tokenizer = tokenizer
        self.hold = max(map(len, stop), default=1) - 1
        self.printed: dict[str, int] = {}

    def new_text(self, out: Any) -> str:
        text = getattr(out, "text", None)
        if text is None:
            text = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)
        if not out.finished:
            text = text.rstrip("\ufffd")
            text = text[: max(0, len(text) - self.hold)]
        done = self.printed.get(out.request_id, 0)
        if len(text) <= done:
            return ""
        self.printed[out.request_id] = len(text)
        return text[done:]


def cmd_generate(args: argparse.Namespace) -> int:
    from .core.config import EngineConfig
    from .core.engine import Engine

    from .core.request import SamplingParams

    sampling: dict[str, Any] = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
                                "ignore_eos": args.ignore_eos}
    for key in ("top_p", "top_k", "min_p", "seed"):
        if getattr(args, key) is not None:
            sampling[key] = getattr(args, key)
    stop = tuple(args.stop or ())
    if stop:
        sampling["stop"] = stop
    try:
        SamplingParams.model_validate(sampling)
    except ValidationError as exc:
        raise ValueError("; ".join(
            f"--{'-'.join(str(p) for p in e['loc']).replace('_', '-')}: {e['msg']}" for e in exc.errors()
        )) from None
    options = {"model": args.model, "dtype": args.dtype, "device": args.device, "kv_memory_gb": args.kv_memory_gb}
    executor = make_executor({"executor": "torch", **options})
    if executor.tokenizer is None:
        raise ValueError(f"--model {args.model}: has no tokenizer, cannot encode text prompts")
    fields = {k: getattr(args, k) for k in ("num_blocks", "block_size") if getattr(args, k) is not None}
    config = EngineConfig.model_validate(fields)
    config = fit_config(config, executor, set(fields))
    engine = Engine(config, executor)
    ids = [str(i) for i in range(len(args.prompts))]
    try:
        for rid, prompt in zip(ids, args.prompts):
            request = {"request_id": rid, "prompt_token_ids": _encode(executor.tokenizer, prompt, args.chat),
                       "sampling": sampling}
            try:
                engine.add_request(request)
            except ValidationError as exc:
                problems = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
                raise ValueError(f"prompt {int(rid) + 1}: {problems}") from None
        _stream(engine, ids, args.prompts, _TextStream(executor.tokenizer, stop))
    finally:
        engine.close()
    return 0


def _stream(engine: Any, ids: list[str], prompts: list[str], texts: _TextStream) -> None:
    """Print each request's text as it grows; with several prompts, one after the other under a
    header, the later ones buffered until their turn."""
    out = sys.stdout
    several = len(ids) > 1
    pending = {rid: [] for rid in ids}
    finished: set[str] = set()
    turn = 0

    def show(i: int) -> None:
        if several:
            out.write(f"{'' if i == 0 else chr(10)}[{i + 1}] {prompts[i]}\n")
        out.write("".join(pending.pop(ids[i])))

    show(0)
    out.flush()
    for o in engine.stream():
        piece = texts.new_text(o)
        rid = o.request_id
        if rid == ids[turn]:
            if piece:
                out.write(piece)
                out.flush()
        else:
            pending[rid].append(piece)
        if o.finished:
            finished.add(rid)
        while ids[turn] in finished and turn + 1 < len(ids):
            turn += 1
            show(turn)
            out.flush()
    out.write("\n")
    out.flush()


def cmd_calibrate(args: argparse.Namespace) -> int:
    from .executors.calibrate import calibrate

    options = {"model": args.model, "dtype": args.dtype, "device": args.device, "kv_memory_gb": args.kv_memory_gb}
    executor = make_executor({"executor": "torch", **options})
    fields = {k: getattr(args, k) for k in ("num_blocks", "block_size") if getattr(args, k) is not None}
    from .core.config import EngineConfig

    config = fit_config(EngineConfig.model_validate(fields), executor, set(fields))
    try:
        calibrate(executor, config, args.out, repeats=args.repeats, quick=args.quick, log=print)
    finally:
        executor.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        argv = ["run"]
    args = parser.parse_args(argv)
    commands = {"run": cmd_run, "compare": cmd_compare, "plugins": cmd_plugins, "workloads": cmd_workloads,
                "serve": cmd_serve, "generate": cmd_generate, "calibrate": cmd_calibrate}
    from .core.diagnostics import validation_message
    from .core.errors import NoProgressError, PluginError

    try:
        return commands[args.command or "run"](args)
    except ValidationError as exc:
        message = validation_message(exc, lambda key: exc.title)
    except (ValueError, PluginError, NoProgressError, OSError) as exc:
        message = str(exc)
    except MemoryError:
        message = "out of memory (lower the workload size or the pool)"
    except RecursionError:
        message = "input nested too deeply"
    except Exception as exc:  # a bug, not the input's fault: still one line, and says so
        message = f"internal error {type(exc).__name__}: {exc} (please report it with the command line)"
    print(f"metroline: error: {' '.join(message.split())}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
