"""The flags of each command (`cli.build_parser` puts them together)."""

from __future__ import annotations

import argparse

def engine_flags(p: argparse.ArgumentParser) -> None:
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


def run_flags(p: argparse.ArgumentParser) -> None:
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
    p.add_argument("--warmup", type=float, metavar="S",
                   help="leave out of the figures the requests arriving in the first S seconds")
    p.add_argument("--horizon", type=float, metavar="S",
                   help="stop at S seconds; requests unfinished then are counted, their latencies "
                   "censored at S (no survivor bias)")
    p.add_argument("--resample", metavar="METHOD",
                   help="how a trace is redrawn for a seed: redraw (default: rows and arrival gaps "
                   "drawn with replacement) or window:S (a random S-second stretch); see core/resample.py")
    p.add_argument("--json", metavar="PATH", help="write the result document")
    p.add_argument("--requests-csv", metavar="PATH", help="write one row per request")
    p.add_argument("--steps-csv", metavar="PATH", help="write one row per step")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on stderr (default: when stderr is a terminal)")

def model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2", help="a model folder, a .gguf file or a known name (default smollm2)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                   help="weights and KV dtype (default float32 on CPU, bfloat16 on CUDA)")
    p.add_argument("--device", help="cpu, cuda, cuda:N (default cuda when available)")
    p.add_argument("--kv-memory", type=float, dest="kv_memory_gb", metavar="GB",
                   help="the KV budget that sizes the pool when --num-blocks is not given")
    p.add_argument("--num-blocks", type=int)
    p.add_argument("--block-size", type=int)


def generate_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompts", nargs="+", metavar="PROMPT", help="one or more prompts (run as one batch)")
    model_flags(p)
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate per prompt (default 64)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 (the default) is greedy")
    p.add_argument("--top-p", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--min-p", type=float)
    p.add_argument("--seed", type=int, help="per-request sampling seed: the same tokens whatever the batch")
    p.add_argument("--stop", action="append", metavar="TEXT", help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at the end-of-sequence token")
    p.add_argument("--chat", action="store_true", help="apply the tokenizer's chat template (the prompt is the user turn)")


def calibrate_flags(p: argparse.ArgumentParser) -> None:
    model_flags(p)
    p.add_argument("--out", default="calibrated.json", metavar="FILE",
                   help="where the fitted cost model goes (default calibrated.json)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs of each batch shape (default 3; the median counts)")
    p.add_argument("--quick", action="store_true", help="a smaller sweep (for a first look or a test)")
