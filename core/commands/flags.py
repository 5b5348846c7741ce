"""The flags of each command (`cli.build_parser` puts them together).

Every flag of `run` and `compare` says its default in its help. The flags leave their value None
when not given (so that a config file's value is not overridden), so the defaults shown are
those of `EngineConfig` and `RunOptions`, read from the models themselves.
"""

from __future__ import annotations

import argparse

from ..config import EngineConfig, RunOptions

COMPARE_REFUSED = {
    "policy": "compare runs the policies of --policies (a+b stacks plugin b on policy a); --policy is for run",
    "requests_csv": "compare writes no per-request CSV; run one policy with `metroline run --policy P "
                    "--requests-csv PATH`",
    "steps_csv": "compare writes no per-step CSV; run one policy with `metroline run --policy P --steps-csv PATH`",
}
"""The flags of `run` that `compare` refuses, with the message it gives (`cmd_compare`)."""


THREADS_HELP = ("CPU threads the model computes with, 1 to 4096 (default: the cores this process may run on "
                "(taskset, cpusets), fewer when the machine is busy, at most OMP_NUM_THREADS)")


def _default(key: str) -> str:
    """`(default X)`, X the default of `EngineConfig` or `RunOptions` field `key`."""
    fields = {**RunOptions.model_fields, **EngineConfig.model_fields}
    return f"(default {fields[key].default})"


def _refused_or(p: argparse.ArgumentParser, compare: bool, *flag: str, **kw: object) -> None:
    """Add `flag`; under `compare`, hidden, for `cmd_compare` to refuse with a clear message."""
    if compare:
        kw = {"help": argparse.SUPPRESS, **{k: v for k, v in kw.items() if k in ("dest", "metavar")}}
    p.add_argument(*flag, **kw)


def engine_flags(p: argparse.ArgumentParser, compare: bool = False) -> None:
    """The `EngineConfig` flags (every command that builds an engine)."""
    _refused_or(p, compare, "--policy",
                help=f"base policy: a shipped name, an entry point or pkg.mod:Obj {_default('policy')}")
    p.add_argument("--plugin", action="append", default=None, metavar="SPEC",
                   help="stack a plugin on the policy (repeatable; later ones take precedence; default: none)")
    p.add_argument("--max-num-seqs", type=int, metavar="N",
                   help=f"most sequences running at once {_default('max_num_seqs')}")
    p.add_argument("--max-batched-tokens", type=int, dest="max_num_batched_tokens", metavar="N",
                   help=f"tokens a step computes, prefill and decode together {_default('max_num_batched_tokens')}")
    p.add_argument("--max-prefill-chunk", type=int, metavar="N",
                   help="most prompt tokens one request prefills in a step when the step starts with more than "
                   "one request: vLLM's long_prefill_token_threshold (default: the step's token budget)")
    p.add_argument("--max-prefill-chunk-adaptive", action="store_true", default=None,
                   help="raise --max-prefill-chunk to the budget / the step's requests when that is larger: "
                   "vLLM's long_prefill_token_threshold_adaptive (default: off)")
    p.add_argument("--no-chunked-prefill", action="store_true", default=None,
                   help="admit a waiting request only when its prompt (within --max-prefill-chunk) fits whole in "
                   "the step's budget left: vLLM's --no-enable-chunked-prefill; needs --max-batched-tokens >= "
                   "--max-model-len (default: chunked prefill on)")
    p.add_argument("--max-model-len", type=int, metavar="N",
                   help=f"longest prompt + output a request may have {_default('max_model_len')}")
    p.add_argument("--block-size", type=int, metavar="N", help=f"tokens per KV block {_default('block_size')}")
    p.add_argument("--num-blocks", type=int, metavar="N",
                   help=f"KV blocks in the device pool {_default('num_blocks')}; the torch executor sizes it "
                   "from --kv-memory")
    p.add_argument("--swap-space-blocks", type=int, metavar="N",
                   help=f"host blocks for swapped requests {_default('swap_space_blocks')}; with --preemption "
                   "swap: as many as --num-blocks")
    p.add_argument("--no-prefix-sharing", action="store_true", default=None,
                   help="turn the prefix cache off (default: on)")
    p.add_argument("--preemption", choices=("recompute", "swap"), dest="preemption_mode",
                   help="a preempted request's KV is freed and recomputed, or swapped to the host "
                   f"{_default('preemption_mode')}")
    p.add_argument("--deterministic", action="store_true", default=None,
                   help="torch executor: batch-invariant numerics, a request's tokens and logprobs bitwise the "
                   "same whatever its companions, chunking and preemptions, at a throughput cost (default: off)")
    p.add_argument("--seed", type=int,
                   help=f"seed of the workload's draw and of sampling; without it (default) a built-in synthetic "
                   f"workload and sampling use seed {EngineConfig.model_fields['seed'].default}, a trace is replayed as "
                   "recorded (any --seed resamples it) and a spec file uses its own seed")
    p.add_argument("--speculative-config", metavar="JSON",
                   help="speculative decoding in vLLM's JSON shape, e.g. '{\"method\": \"ngram\", "
                   "\"num_speculative_tokens\": 4}' (method ngram or draft_model with model; "
                   "prompt_lookup_min/max; the simulator's acceptance_rate; default: none)")
    p.add_argument("--preset", help="a bundle of scheduler options that reproduces a real engine "
                   "(vllm); explicit flags and config keys override it (default: none)")
    p.add_argument("--config", metavar="PATH", help="TOML or JSON file of EngineConfig fields, plugin "
                   "options ([plugin_options.NAME]) and run options ([run]); flags override it; paths in "
                   "it are relative to its folder (default: none)")
    p.add_argument("--debug", action="store_true", default=None,
                   help="log every request transition on stderr, tagged with the policy (default: off)")


def torch_flags(p: argparse.ArgumentParser) -> None:
    """The torch executor's options of `run`, `compare` and `serve`."""
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                   help="torch executor: weights and KV dtype (default float32 on CPU, bfloat16 on CUDA)")
    p.add_argument("--device", help="torch executor: cpu, cuda, cuda:N (default cuda when available)")
    p.add_argument("--kv-memory", type=float, dest="kv_memory_gb", metavar="GB",
                   help="torch executor: the KV budget that sizes the pool when --num-blocks is not given "
                   "(default 85%% of the free GPU memory; on CPU 1 GB, at most a quarter of the RAM)")
    p.add_argument("--threads", type=int, metavar="N",
                   help="torch executor: " + THREADS_HELP)


def serve_flags(p: argparse.ArgumentParser) -> None:
    """The flags of `serve` beyond the engine's (`ServeConfig`; a config file's `[serve]` table
    gives them too, the flags win)."""
    from ..serving.tenants import ServeConfig

    def default(key: str) -> str:
        return f"(default {ServeConfig.model_fields[key].default})"

    p.add_argument("--model", help="the model to serve (with --executor sim: only the name /v1/models lists)")
    p.add_argument("--executor", choices=("sim", "torch"), help="sim (default): the cost model in real time")
    torch_flags(p)
    p.add_argument("--cost-model", choices=("steps", "linear", "roofline", "calibrated"),
                   help="sim executor: how long a step takes (default roofline)")
    p.add_argument("--step-time", type=float, metavar="S", help="seconds per step of the steps cost model (default 0.01)")
    p.add_argument("--cost-param", action="append", default=None, metavar="KEY=VALUE",
                   help="a cost model parameter, e.g. gpu=H100 (repeatable; default: the cost model's own)")
    p.add_argument("--host", help=f"address to listen on {default('host')}")
    p.add_argument("--port", type=int, help=f"port {default('port')}; 0: one the system picks, said when listening")
    p.add_argument("--max-waiting", type=int, metavar="N",
                   help="answer 429 at once past N waiting requests, 413 to a batch of more prompts (default: 1024)")
    p.add_argument("--ramp-s", type=float, metavar="S",
                   help=f"cold start: reach max_num_seqs in flight over S seconds {default('ramp_s')}")
    p.add_argument("--buffer-tokens", type=int, metavar="N",
                   help=f"pause a stream whose reader is N tokens behind {default('buffer_tokens')}")
    p.add_argument("--buffer-bytes", type=int, metavar="N",
                   help=f"pause a stream whose socket holds N bytes its client has not taken {default('buffer_bytes')}")
    p.add_argument("--stall-timeout", type=float, metavar="S",
                   help=f"cancel a stream paused for S seconds {default('stall_timeout')}")
    p.add_argument("--default-max-tokens", type=int, metavar="N",
                   help="max_tokens of a request that gives none, within max_model_len (default: the rest "
                   "of the context, as vLLM)")
    p.add_argument("--drain-s", type=float, metavar="S",
                   help=f"on SIGTERM, let streams finish for S seconds, then cancel them {default('drain_s')}")
    p.add_argument("--cache-salt", action=argparse.BooleanOptionalAction, default=None,
                   help="a prefix-cache salt per tenant (default: on with several tenants)")
    p.add_argument("--max-body-bytes", type=int, metavar="N",
                   help=f"refuse (413) a request body over N bytes before reading it {default('max_body_bytes')}")
    p.add_argument("--hook-budget", dest="hook_budget_s", type=float, metavar="S",
                   help=f"stop a plugin call running past S seconds inside the step, failing its request "
                   f"(0: no budget) {default('hook_budget_s')}")
    p.add_argument("--public-metrics", action=argparse.BooleanOptionalAction, default=None,
                   help="with tenants, /metrics needs no operator key ([serve] operator_keys) (default: off)")


def run_flags(p: argparse.ArgumentParser, compare: bool = False) -> None:
    """The run options (`RunOptions`) and output files of `run` and `compare`."""
    workload_default = ("(default chat-steady, chat's requests at about 0.8 x the engine's capacity; chat with "
                        "--replicas or --routers)" if compare else _default("workload"))
    p.add_argument("--workload", help="a built-in name (see `metroline workloads`) or a .csv/.jsonl/.toml/.json "
                   f"file {workload_default}")
    p.add_argument("--executor", help="sim: the simulated executor; torch: a Hugging Face model on "
                   f"paged KV; or an entry point of metroline.executors, or pkg.mod:factory {_default('executor')}")
    p.add_argument("--model", help="torch executor: a model folder, a .gguf file or a known name (smollm2) "
                   "(default: none)")
    torch_flags(p)
    p.add_argument("--cost-model", choices=("steps", "linear", "roofline", "calibrated"),
                   help=f"how long a simulated step takes {_default('cost_model')}; roofline is llama-3-8b on "
                   "an A100 unless --cost-param model=/gpu= say otherwise; steps counts steps, for teaching")
    p.add_argument("--step-time", type=float, metavar="S", help="seconds per step of the steps cost model "
                   "(default 0.01; without --cost-model it means --cost-model steps)")
    p.add_argument("--cost-param", action="append", default=None, metavar="KEY=VALUE",
                   help="a cost model parameter, e.g. gpu=H100 or path=steps.csv (repeatable; default: the "
                   "cost model's own)")
    p.add_argument("--rate-scale", type=float, metavar="X",
                   help=f"multiply the arrival rate (2 doubles it) {_default('rate_scale')}")
    p.add_argument("--length-scale", type=float, metavar="X",
                   help=f"multiply every prompt and output length {_default('length_scale')}")
    p.add_argument("--max-requests", type=int, metavar="N",
                   help="keep the first N requests by arrival (default: all)")
    p.add_argument("--groups", type=int, metavar="N", help="number of groups of the mixed-64 workload (default 10)")
    p.add_argument("--oracle-lengths", action="store_true", default=None,
                   help="let policies see each request's true output length; the results say so (default: off)")
    p.add_argument("--traces-dir", metavar="PATH",
                   help="folder of the trace files (default: $METROLINE_TRACES, else ../shared/traces)")
    p.add_argument("--window", type=float, metavar="S",
                   help=f"seconds per fairness window: whole-run totals hide unfairness {_default('window')}")
    p.add_argument("--warmup", type=float, metavar="S",
                   help="leave out of the figures the requests arriving in the first S seconds (default 0)")
    p.add_argument("--horizon", type=float, metavar="S",
                   help="stop at S seconds; requests unfinished then are counted, their latencies "
                   "censored at S: no survivor bias (default: the end of the run)")
    p.add_argument("--resample", metavar="METHOD",
                   help="how a trace is redrawn for a seed: redraw (default: rows and arrival gaps "
                   "drawn with replacement, idle gaps capped at the trace's p99 gap), window:S (a random S-second stretch) "
                   "or gamma:B (rows drawn, gamma arrivals of burstiness B at the trace's rate, as vLLM's --burstiness); "
                   "see core/workloads/resample.py")
    p.add_argument("--json", metavar="PATH", help="write the result document (default: none)")
    _refused_or(p, compare, "--requests-csv", metavar="PATH", help="write one row per request (default: none)")
    _refused_or(p, compare, "--steps-csv", metavar="PATH", help="write one row per step, with a running[TENANT] column per tenant (default: none)")
    p.add_argument("--progress", nargs="?", const="auto", choices=("auto", "bar", "plain", "off"), metavar="MODE",
                   help="progress on stderr: bar (redrawn in place), plain (a line every 30 s at most, for logs "
                   "and pipes) or off (default and bare --progress: auto, a bar when stderr is a terminal, plain "
                   "lines otherwise)")
    p.add_argument("--no-progress", dest="progress", action="store_const", const="off",
                   help="no progress output, the same as --progress off (default: auto, see --progress)")
    p.add_argument("--report", metavar="DIR", help="write report.md, report.html, PNG plots and per-request CSVs "
                   "into DIR (needs matplotlib: the report extra; default: none)")


def cluster_flags(p: argparse.ArgumentParser, serving: bool = False) -> None:
    """The cluster's flags: of `run` and `compare` (simulated, `core/cluster/`), or with `serving`
    of `serve` (replica servers behind one front, `core/serving/front.py`); a `[cluster]` table in
    the config file says the same, the flags over it."""
    if serving:
        p.add_argument("--replicas", type=int, metavar="N",
                       help="serve N replica servers, each its own process and engine, behind a front that "
                       "routes every request (default: one engine, no front)")
    else:
        p.add_argument("--replicas", type=int, metavar="N",
                       help="simulate N engines behind a router on one virtual clock (default: one engine, no router)")
    p.add_argument("--pools", metavar="POOL=N,...",
                   help="replicas by pool instead of --replicas, e.g. short=3,long=1 (default: one pool)")
    p.add_argument("--router", metavar="NAME",
                   help="the route plugin: round_robin, least_outstanding_tokens, power_of_two, prefix_aware, "
                   "length_pools, an entry point or pkg.mod:Obj (default round_robin)")
    p.add_argument("--router-option", action="append", default=None, metavar="KEY=VALUE",
                   help="an option of the router (repeatable; an int or float when it parses as one), e.g. "
                   "threshold=2048 (default: none)")
    if serving:
        p.add_argument("--ray", nargs="?", const="", metavar="ADDRESS",
                       help="the replicas as Ray actors instead of local processes: on the cluster at ADDRESS, or "
                       "without one the cluster $RAY_ADDRESS names, else a new local one (default: local processes)")


def slo_flag(p: argparse.ArgumentParser, required: bool = False) -> None:
    """`--slo`: latency bounds for SLO attainment and goodput (`metroline.core.experiments.slo`)."""
    p.add_argument("--slo", required=required, metavar="METRIC=S,...",
                   help="latency bounds in seconds, e.g. ttft=0.5,tpot=0.05 (metrics: ttft, tpot, e2e): "
                   "SLO attainment and goodput (requests/s within every bound)" + ("" if required else " (default: none)"))


def ray_flag(p: argparse.ArgumentParser) -> None:
    """`--ray [ADDRESS]`: the runs as tasks of a Ray cluster (`metroline.core.experiments.ray_runner`)."""
    p.add_argument("--ray", nargs="?", const="", metavar="ADDRESS",
                   help="run on a Ray cluster instead of local worker processes: at ADDRESS, or without one "
                   "the cluster $RAY_ADDRESS names, else a new local one (pip install 'metroline[ray]'); the "
                   "results do not depend on it (default: local processes)")


def sweep_flags(p: argparse.ArgumentParser) -> None:
    """The rates and SLO of `sweep` (`metroline.core.experiments.sweep`)."""
    p.add_argument("--rates", required=True, metavar="R1,R2,...|auto",
                   help="arrival rates in requests/s (the workload's arrivals scaled to each), or auto: "
                   "each policy's capacity at SLO by bisection from the workload's own rate")
    slo_flag(p, required=True)
    p.add_argument("--tolerance", type=float, default=0.05,
                   help="with --rates auto: stop when the bracket's ends are within this ratio (default 0.05)")


def model_flags(p: argparse.ArgumentParser) -> None:
    """The model of `generate` and `calibrate`."""
    p.add_argument("--model", default="smollm2", help="a model folder, a .gguf file or a known name (default smollm2)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                   help="weights and KV dtype (default float32 on CPU, bfloat16 on CUDA)")
    p.add_argument("--device", help="cpu, cuda, cuda:N (default cuda when available)")
    p.add_argument("--kv-memory", type=float, dest="kv_memory_gb", metavar="GB",
                   help="the KV budget that sizes the pool when --num-blocks is not given")
    p.add_argument("--threads", type=int, metavar="N", help=THREADS_HELP[0].upper() + THREADS_HELP[1:])
    p.add_argument("--num-blocks", type=int)
    p.add_argument("--block-size", type=int)


def generate_flags(p: argparse.ArgumentParser) -> None:
    """The flags of `generate`."""
    p.add_argument("prompts", nargs="+", metavar="PROMPT", help="one or more prompts (run as one batch)")
    model_flags(p)
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate per prompt (default 64)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 (the default) is greedy")
    p.add_argument("--top-p", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--min-p", type=float)
    p.add_argument("--seed", type=int, help="per-request sampling seed: the same tokens whatever the batch")
    p.add_argument("--stop", action="append", metavar="TEXT", help="stop string (repeatable)")
    p.add_argument("--speculative-config", metavar="JSON",
                   help="speculative decoding in vLLM's JSON shape, e.g. '{\"method\": \"ngram\", "
                   "\"num_speculative_tokens\": 4}' (method ngram or draft_model with model; "
                   "prompt_lookup_min/max; the simulator's acceptance_rate; default: none)")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at the end-of-sequence token")
    p.add_argument("--deterministic", action="store_true", default=None,
                   help="batch-invariant numerics: each prompt's tokens and logprobs bitwise the same whatever "
                   "the other prompts; refused with --speculative-config, and for a model whose forward cannot be "
                   "made batch-invariant (default: off)")
    template = p.add_mutually_exclusive_group()
    template.add_argument("--chat", action="store_true",
                          help="the prompt is the user turn of the tokenizer's chat template; an error when the "
                          "model has none (default: the template when the model has one)")
    template.add_argument("--raw", action="store_true",
                          help="the prompt as it is, without the chat template (default: the template when the "
                          "model has one)")


def calibrate_flags(p: argparse.ArgumentParser) -> None:
    """The flags of `calibrate`."""
    model_flags(p)
    p.add_argument("--out", default="calibrated.json", metavar="FILE",
                   help="where the fitted cost model goes (default calibrated.json)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs of each batch shape (default 3; the median counts)")
    p.add_argument("--quick", action="store_true", help="a smaller sweep (for a first look or a test)")
