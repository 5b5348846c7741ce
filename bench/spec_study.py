"""Speculative decoding and continuous batching in the simulator: where their gains add, multiply,
or speculation hurts; and the adaptive draft count against fixed ones at high load.

Part 1 (throughput and P99 TPOT against the acceptance rate, 0.2 to 0.9): the Azure conversation
trace's first requests, llama-3-8b on an A100 (the default roofline cost model), a draft model at
`draft_cost` of the target's forward (default 0.05) with `k` drafts, under

- neither: batch 1 (`max_num_seqs 1`), no speculation: the baseline;
- continuous batching alone: `max_num_seqs 64`;
- speculation alone: batch 1 with `k` drafts;
- both: batch 64 with `k` drafts.

Gains are throughputs over the baseline's; "sum" is `g_cb + g_spec - 1` and "product" `g_cb x
g_spec`; the combined gain is placed against both.

Part 2 (adaptive against fixed k, at high load): the same trace at a rate that loads the batch-64
engine, `--seeds` redraws, the arms of `bench/spec_arms.toml` (`adaptive_speculation` with up to
5 drafts, k = 1..5, no speculation; each request's acceptance drawn from Beta around 0.6,
concentration 4, keyed on request and position so the arms are paired) run by `compare_arms`, as
`metroline compare --arms bench/spec_arms.toml` runs them: P99 TPOT of each arm with the 95 %
interval of its paired difference from the adaptive arm and the verdict (and the same for mean
TPOT, throughput and P99 TTFT), controlled over the whole table of metrics (`--correction`: maxt, the default, holm or none, as `compare --correction`).

`--tail N` (with part 2; `--seeds 0` runs only this): which requests make the P99 TPOT, on the first draw, for the adaptive
arm and each arm named by `--tail-arms`: the N requests of largest TPOT with their first-token and
finish times, output tokens and acceptance draw, and when the batch first held 64 decodes (the end
of the cold start, where every step is a full 2,048-token prefill chunk); and the steps from
`--warmup-s` to the last arrival: their mean length, decodes a step, and the tokens a decode gains a
step (a request whose drafts all fail gains 1, so its TPOT is the mean step).

`--warmup-s W` (with part 2): measure the steady state of high load, not the cold start of an
empty engine: every arm's runs are measured in the same window (`compare_arms(measure=)`, as
`compare --warmup`): the requests that arrive in the first W seconds are left out of the latency
figures (they still load the engine), and throughput is the output tokens produced from W seconds on
over the window. With `--requests` in the thousands the window is most of the run. `--acceptance
MEAN,CONCENTRATION` redraws every arm's per-request acceptance from Beta(MEAN x C, (1 - MEAN) x C)
instead of the arms file's (0.6, 4). `--adaptive-option KEY=JSON` sets an option of the adaptive
arm's `adaptive_speculation` (`tail_power=32`).

Run:  .venv/bin/python bench/spec_study.py [--requests 400] [--seeds 5] [--tail 8] [--warmup-s 20]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from statistics import mean

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
ARMS = Path(__file__).resolve().parent / "spec_arms.toml"

from metroline.core.config import EngineConfig  # noqa: E402
from metroline.core.experiments.runner import run_workload  # noqa: E402
from metroline.core.experiments.arms import compare_arms, load_arms  # noqa: E402
from metroline.core.requests.request import SamplingParams  # noqa: E402
from metroline.core.results.collector import DECODING, DURATION_S, TIME_S  # noqa: E402
from metroline.core.requests.sequence import Sequence  # noqa: E402
from metroline.core.results.horizon import MeasurementWindow  # noqa: E402
from metroline.core.results.min_effect import CORRECTIONS, DEFAULT_CORRECTION  # noqa: E402
from metroline.core.workloads.build import build_workload  # noqa: E402
from metroline.executors.cost_models import make_cost_model  # noqa: E402
from metroline.executors.simulated import SimulatedExecutor  # noqa: E402
from metroline.executors.speculation_sim import AcceptanceModel  # noqa: E402


def run(workload, batch: int, spec: dict | None, plugins: tuple[str, ...] = ()) -> dict:
    config = EngineConfig(max_num_seqs=batch, num_blocks=8192, plugins=list(plugins), speculative_config=spec)
    doc, _ = run_workload(workload, config, SimulatedExecutor(make_cost_model("roofline")))
    s = doc["summary"]
    return {"tput": s["output_throughput_tok_s"], "tpot_p99": s["tpot_s"]["p99"] * 1e3,
            "accepted": doc.get("speculation", {}).get("mean_acceptance_length")}


def part1(args: argparse.Namespace) -> None:
    wl = build_workload("azure-conv", max_requests=args.requests, rate_scale=args.rate_scale, seed=0)
    print(f"== part 1: azure-conv, first {args.requests} requests x{args.rate_scale} rate, roofline llama-3-8b A100; "
          f"k = {args.k}, draft cost {args.draft_cost} of a target forward")
    base = run(wl, 1, None)
    cb = run(wl, 64, None)
    g_cb = cb["tput"] / base["tput"]
    print(f"  batch 1, no speculation: {base['tput']:8.1f} tok/s, P99 TPOT {base['tpot_p99']:7.2f} ms")
    print(f"  batch 64, no speculation: {cb['tput']:8.1f} tok/s, P99 TPOT {cb['tpot_p99']:7.2f} ms "
          f"(gain {g_cb:.2f}x)")
    print(f"  {'rate':>5} | {'spec@1 tok/s':>12} {'gain':>6} {'P99 TPOT':>9} | {'both tok/s':>10} {'gain':>6} "
          f"{'P99 TPOT':>9} | {'sum':>6} {'product':>7} | where")
    for rate in (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9):
        spec = {"method": "draft_model", "model": "draft", "num_speculative_tokens": args.k,
                "acceptance_rate": rate, "draft_cost": args.draft_cost}
        alone = run(wl, 1, spec)
        both = run(wl, 64, spec)
        g_spec = alone["tput"] / base["tput"]
        g_both = both["tput"] / base["tput"]
        total, product = g_cb + g_spec - 1, g_cb * g_spec
        where = ("below the sum" if g_both < total else "above the product" if g_both > product
                 else "between sum and product")
        if both["tput"] < cb["tput"]:
            where += "; speculation hurts the batch"
        print(f"  {rate:5.1f} | {alone['tput']:12.1f} {g_spec:5.2f}x {alone['tpot_p99']:8.2f} | {both['tput']:10.1f} "
              f"{g_both:5.2f}x {both['tpot_p99']:8.2f} | {total:5.2f}x {product:6.2f}x | {where}")


def study_arms(args: argparse.Namespace) -> list:
    """The arms of `bench/spec_arms.toml`, their acceptance draw replaced by `--acceptance`'s."""
    arms = load_arms(ARMS)
    if args.adaptive_option:
        options = {k: json.loads(v) for k, v in (o.split("=", 1) for o in args.adaptive_option)}
        arms = [arm.model_copy(update={"config": {**arm.config, "plugin_options": {"adaptive_speculation": options}}})
                if arm.name == "adaptive" else arm for arm in arms]
    if args.acceptance:
        rate, concentration = (float(x) for x in args.acceptance.split(","))
        change = {"acceptance_rate": rate, "acceptance_concentration": concentration}
        arms = [arm.model_copy(update={"config": {**arm.config, "speculative_config": {
            **arm.config["speculative_config"], **change}}}) if arm.config.get("speculative_config") else arm
            for arm in arms]
    return arms


def part2(args: argparse.Namespace) -> None:
    arms = study_arms(args)
    acceptance = args.acceptance or "0.6,4"
    rate, concentration = acceptance.split(",")
    print(f"== part 2: P99 TPOT at high load: azure-conv, first {args.requests} requests x{args.load} rate, batch 64, "
          f"{args.seeds} seeds (paired), the arms of {ARMS.relative_to(ARMS.parents[1])} (acceptance Beta around {rate}, "
          f"concentration {concentration}); verdicts controlled over the whole table ({args.correction}), as "
          f"`compare --arms` gives them" + (f"; adaptive with {' '.join(args.adaptive_option)}" if args.adaptive_option else ""))
    measure = MeasurementWindow(args.warmup_s) if args.warmup_s else None
    if measure:
        print(f"   steady state: requests arriving before {args.warmup_s:g} s left out of every arm's latency figures; "
              f"throughput over the output tokens from {args.warmup_s:g} s on")
    seeds = list(range(args.seeds))
    draws = [build_workload("azure-conv", max_requests=args.requests, rate_scale=args.load, seed=s) for s in seeds]
    config = EngineConfig(max_num_seqs=64, num_blocks=8192)
    result = compare_arms(arms, draws, seeds, config=config, jobs=args.jobs, correction=args.correction,
                          measure=measure)
    print(f"   the last arrival at {min(d.items[-1].arrival_s for d in draws):.1f} to "
          f"{max(d.items[-1].arrival_s for d in draws):.1f} s")
    table = result["comparison"]["policies"]
    base = arms[0].name
    for key, title, scale, unit in (("summary.tpot_s.p99", "P99 TPOT", 1e3, "ms"), ("summary.tpot_s.mean", "mean TPOT", 1e3, "ms"),
                                    ("summary.output_throughput_tok_s", "output throughput", 1.0, "tok/s"),
                                    ("summary.ttft_s.p99", "P99 TTFT", 1.0, "s")):
        values = table[base][key]["values"]
        print(f"  {title}: {base} {' '.join(f'{v * scale:.1f}' for v in values)} {unit}, mean {mean(values) * scale:.1f}")
        for arm in arms[1:]:
            entry = table[arm.name][key]
            vs = entry["vs_baseline"]
            d, rel = vs["difference"], vs["relative"]
            print(f"    {arm.name:<5} mean {mean(entry['values']) * scale:7.1f} {unit}; {arm.name} - {base} = "
                  f"{d['estimate'] * scale:+7.2f} [{d['low'] * scale:+.2f}, {d['high'] * scale:+.2f}] "
                  f"({rel['estimate']:+.1%}): {arm.name} {vs['verdict']}"
                  + (f" (uncorrected: {vs['verdict_uncorrected']})" if vs.get("removed_by") else ""))


def tail(args: argparse.Namespace) -> None:
    """The `--tail` largest TPOTs of the first draw under the adaptive arm and `--tail-arms`."""
    arms = {a.name: a for a in study_arms(args)}
    workload = build_workload("azure-conv", max_requests=args.requests, rate_scale=args.load, seed=0)
    print(f"== part 2, the P99 TPOT's requests: draw 0, the {args.tail} largest TPOTs of each arm"
          + (f", of the requests arriving from {args.warmup_s:g} s on" if args.warmup_s else ""))
    for name in ["adaptive", *args.tail_arms.split(",")]:
        config = arms[name].engine_config(EngineConfig(max_num_seqs=64, num_blocks=8192))
        doc, engine = run_workload(workload, config, SimulatedExecutor(make_cost_model("roofline")))
        steps = engine.metrics.steps
        full = next((s[TIME_S] for s in steps if s[DECODING] >= config.max_num_seqs), None)
        model = AcceptanceModel(config.speculative_config) if config.speculative_config else None
        rows = sorted(((r.finish_s - r.first_token_s) / (r.output_tokens - 1), r) for r in engine.metrics.requests
                      if r.output_tokens >= 2 and r.finish_s is not None and r.arrival_s >= args.warmup_s)
        p99 = float(np.percentile([t for t, _ in rows], 99))
        print(f"  {name}: P99 TPOT {p99 * 1e3:.1f} ms; the batch first held {config.max_num_seqs} decodes at "
              f"{full if full is None else round(full, 2)} s")
        window = [s for s in steps if args.warmup_s <= s[TIME_S] <= workload.items[-1].arrival_s]
        if window:
            spec = doc.get("speculation") or {}
            print(f"    steps from {args.warmup_s:g} s to the last arrival: {len(window)}, mean "
                  f"{sum(s[DURATION_S] for s in window) / len(window) * 1e3:.2f} ms, "
                  f"{sum(s[DECODING] for s in window) / len(window):.1f} decodes a step; "
                  f"tokens per request-step {spec.get('tokens_per_request_step') or 1.0:.2f}; "
                  f"the run's throughput {doc['summary']['output_throughput_tok_s']:.0f} tok/s")
        for t, r in rows[::-1][:args.tail]:
            seq = Sequence(r.id.split("#")[0], [1], SamplingParams(max_new_tokens=1), 0.0)
            a = f"{model.rate(seq):.2f}" if model else "-"
            print(f"    {t * 1e3:6.1f} ms  request {r.id:>5}  tokens {r.output_tokens:4d}  acceptance {a}  "
                  f"decoding {r.first_token_s:6.2f}-{r.finish_s:6.2f} s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--rate-scale", type=float, default=0.5, help="part 1's arrival rate scale")
    p.add_argument("--load", type=float, default=3.0, help="part 2's arrival rate scale (high load)")
    p.add_argument("--seeds", type=int, default=5, help="part 2's draws (0: only --tail)")
    p.add_argument("--jobs", type=int, default=2, help="part 2's worker processes")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--correction", choices=CORRECTIONS, default=DEFAULT_CORRECTION, help="part 2's family-wise correction")
    p.add_argument("--draft-cost", type=float, default=0.05)
    p.add_argument("--warmup-s", type=float, default=0.0,
                   help="part 2: leave out the requests arriving in the first W seconds (the cold start), every arm alike")
    p.add_argument("--acceptance", default="", metavar="MEAN,CONCENTRATION",
                   help="part 2: every arm's per-request acceptance from Beta around MEAN (default: the arms file's 0.6,4)")
    p.add_argument("--adaptive-option", action="append", default=[], metavar="KEY=JSON",
                   help="part 2: an option of the adaptive arm's adaptive_speculation (e.g. tail_power=32); repeatable")
    p.add_argument("--part", type=int, choices=(1, 2))
    p.add_argument("--tail", type=int, default=0, help="part 2: print the N largest TPOTs of draw 0 per arm")
    p.add_argument("--tail-arms", default="k1,k2,k3", help="the fixed arms --tail shows beside the adaptive one")
    args = p.parse_args()
    if args.part in (None, 1):
        part1(args)
    if args.part in (None, 2):
        if args.seeds:
            part2(args)
        if args.tail:
            tail(args)


if __name__ == "__main__":
    main()
