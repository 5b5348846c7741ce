"""Fairness figures of `weighted_fair` and `token_rr` (simulation, `steps` cost model, 0.01 s a step).

1. weights 1:2 -- two tenants (a: weight 1, b: weight 2), 2400 requests half each, all arriving at
   t=0 (far above capacity), 32 slots, VTC weights w_in 1 / w_out 2, 1 s windows: the weighted
   service ratio b/a per window while both tenants have requests waiting (windows after the first
   that end before a tenant's queue runs dry), and the windows after that (the drain).
2. 10x load -- `big` sends 10x the requests of `small` (1.0x and 0.1x capacity, 1.1x together;
   capacity = max_num_seqs / (mean output tokens x 0.01 s)): small's p99 TTFT alone, shared under
   weighted_fair (VTC: a waiting request preempts nobody), weighted_fair with `preempt`, and FCFS;
   uniform lengths (mean output 32) on 32, 128 and 256 slots with plenty of KV blocks, and the
   `chat` workload's lengths (mean output 128, prompts up to 4096) on the default engine, where
   KV blocks, not slots, run out first.
3. token round-robin -- 12 slots, a decode share capped at 4 tokens a step: the largest decode-token
   difference between two requests over the steps both were decoding (token_rr vs fcfs).

Run:  .venv/bin/python bench/fairness.py [--seeds 5]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from metroline.core.config import EngineConfig
from metroline.core.experiments.runner import run_workload
from metroline.core.results.metrics import DECODE_TOKENS, DECODING, fairness
from metroline.core.workloads.build import SyntheticSpec, Workload, generate
from metroline.executors.cost_models import make_cost_model
from metroline.executors.simulated import SimulatedExecutor

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_policy_token_rr import DecodeLag, DecodeShare  # noqa: E402  (the test's own probes)

STEP = 0.01
LENGTHS = dict(prompt_len={"dist": "uniform", "low": 16, "high": 112},
               output_len={"dist": "uniform", "low": 8, "high": 56})
MEAN_OUTPUT = 32


def run(items, policy, max_num_seqs, options=None, plugins=(), **config):
    fields = dict(max_num_seqs=max_num_seqs, max_num_batched_tokens=1024, num_blocks=8192,
                  policy=policy, plugin_options={policy: options or {}})
    fields.update(config)
    return run_workload(Workload("w", items), EngineConfig(**fields),
                        SimulatedExecutor(make_cost_model("steps", step_time=STEP)), plugins=list(plugins))


def weights_one_to_two(seeds: range) -> None:
    print("1. weighted_fair, weights a:b = 1:2, both backlogged (2400 requests at t=0, 32 slots, 1 s windows)")
    print(f"   {'seed':>4} {'windows':>8} {'min b/a':>8} {'max b/a':>8} {'min Jain':>9}   drain windows b/a")
    for seed in seeds:
        spec = SyntheticSpec(num_requests=2400, rate=None, tenants={"a": 1, "b": 1}, seed=seed, **LENGTHS)
        _, engine = run(generate(spec, namespace="wf-ratio"), "weighted_fair", 32,
                        {"weights": {"a": 1, "b": 2}, "w_in": 1, "w_out": 2})
        recs = engine.metrics.requests
        dry = min(max(r.first_scheduled_s for r in recs if r.tenant == t) for t in "ab")
        f = fairness(recs, window_s=1.0, w_in=1, w_out=2, weights={"a": 1, "b": 2})
        inside = [w for w in f["windows"][1:] if w["end_s"] <= dry]
        ratios = [w["service"]["b"] / w["service"]["a"] for w in inside]
        drain = [w for w in f["windows"] if w["end_s"] > dry]
        tail = " ".join(f"{w['service']['b'] / w['service']['a']:.2f}" if w["service"]["a"] else "a:0" for w in drain)
        print(f"   {seed:>4} {len(inside):>8} {min(ratios):>8.3f} {max(ratios):>8.3f} "
              f"{min(w['jain'] for w in inside):>9.4f}   {tail}")


CHAT_LENGTHS = dict(prompt_len={"dist": "lognormal", "mean": 512, "sigma": 0.8, "min": 16, "max": 4096},
                    output_len={"dist": "lognormal", "mean": 128, "sigma": 0.8, "min": 4, "max": 1024})


def ten_x_load(seeds: range) -> None:
    print("2. small's p99 TTFT (ms) when big sends 10x its load (1.0x + 0.1x capacity), and its multiple of alone")
    print(f"   {'setting':<34} {'seed':>4} {'alone':>6} {'wf':>6} {'x':>5} {'wf+preempt':>10} {'x':>5} "
          f"{'fcfs':>7} {'x':>6}")
    settings = [(f"uniform lengths, {n} slots, 3 s", n, LENGTHS, MEAN_OUTPUT, 3.0, {"max_num_batched_tokens": 1024})
                for n in (32, 128, 256)]
    settings.append(("chat lengths, default engine, 8 s", 256, CHAT_LENGTHS, 128, 8.0, {}))
    for label, slots, lengths, mean_output, duration, config in settings:
        capacity = slots / (mean_output * STEP)
        for seed in seeds:
            small = generate(SyntheticSpec(num_requests=round(0.1 * capacity * duration), rate=0.1 * capacity,
                                           tenants={"small": 1}, seed=seed, **lengths), namespace="wf-small")
            big = generate(SyntheticSpec(num_requests=round(capacity * duration), rate=capacity,
                                         tenants={"big": 1}, seed=seed, **lengths), namespace="wf-big")
            p99 = {}
            for key, policy, items, options in (
                ("alone", "weighted_fair", small, {}), ("wf", "weighted_fair", small + big, {}),
                ("wfp", "weighted_fair", small + big, {"preempt": True}), ("fcfs", "fcfs", small + big, {}),
            ):
                fields = dict(config)
                if config:
                    fields["num_blocks"] = 8192
                doc, _ = run(items, policy, slots, options, **fields) if config else run_default(items, policy, options)
                p99[key] = doc["tenants"]["small"]["ttft_s"]["p99"] * 1000
            a = p99["alone"]
            print(f"   {label:<34} {seed:>4} {a:>6.1f} {p99['wf']:>6.1f} {p99['wf'] / a:>5.2f} {p99['wfp']:>10.1f} "
                  f"{p99['wfp'] / a:>5.2f} {p99['fcfs']:>7.1f} {p99['fcfs'] / a:>6.1f}")


def run_default(items, policy, options):
    """The default EngineConfig (256 slots, 2048-token budget, 8192 blocks of 16 tokens)."""
    return run_workload(Workload("w", items), EngineConfig(policy=policy, plugin_options={policy: options}),
                        SimulatedExecutor(make_cost_model("steps", step_time=STEP)))


def token_round_robin(seeds: range) -> None:
    print("3. decode lag with a decode share of 4 tokens for 12 slots (150 requests, 150 req/s)")
    print(f"   {'seed':>4} {'steps':>6} {'short steps':>12} {'token_rr lag':>13} {'fcfs lag':>9}")
    for seed in seeds:
        spec = SyntheticSpec(num_requests=150, rate=150.0, prompt_len={"dist": "uniform", "low": 8, "high": 48},
                             output_len={"dist": "uniform", "low": 4, "high": 60}, seed=seed)
        lags, steps = {}, None
        for policy in ("token_rr", "fcfs"):
            lag = DecodeLag()
            _, engine = run(generate(spec, namespace="rr"), policy, 12, plugins=[DecodeShare(4, 16), lag],
                            block_size=16, num_blocks=1024, max_num_batched_tokens=64)
            lags[policy] = lag.worst
            if steps is None:
                steps = engine.metrics.steps
        short = sum(1 for s in steps if s[DECODING] > s[DECODE_TOKENS])
        print(f"   {seed:>4} {len(steps):>6} {short:>12} {lags['token_rr']:>13} {lags['fcfs']:>9}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 (default 5)")
    args = parser.parse_args()
    seeds = range(args.seeds)
    start = time.perf_counter()
    weights_one_to_two(seeds)
    print()
    ten_x_load(seeds)
    print()
    token_round_robin(seeds)
    print(f"\n({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
