"""A randomized differential fuzz: `--preset vllm` against vLLM 0.33's own v1 scheduler on random
configurations and workloads.

Each case is drawn from its seed (`draw_case`): a token budget of 16 to 4,096 (log-uniform),
1 to 256 sequences (at most the budget, as vLLM requires), a block pool from one that barely holds
the largest request (preemption) to one that holds them all, vLLM's `fcfs` or `priority` (with
ties: one to six levels, simultaneous arrivals), prefix caching on or off, the long-prefill chunk
cap (`max_prefill_chunk`, vLLM's `long_prefill_token_threshold`, adaptive or not) off or on,
chunked prefill off (`enable_chunked_prefill = false`, with `max_model_len` = the budget, as vLLM
requires), n-gram speculative decoding (1 to 5 drafts, any acceptance rate) with and without the
chunk cap, and a small workload: 1 to 40 requests arriving in a burst or a Poisson stream, prompts
of 1 to 2,000 tokens that may share up to three prefixes, 1 to 200 output tokens.

vLLM's side is `bench/vllm_reference.py`'s replay (its fake model runner and step clock); the
comparison is per request (first-scheduled, first-token and finish times bit-equal, and its
preemptions) and per case (steps and preemptions). A case is identical when all of them are.

    # vLLM's side live (the venv of bench/vllm_reference.py's docstring), recorded as a corpus
    /work/vllm-venv/bin/python bench/vllm_fuzz.py --live --cases 2600 --record tests/data/vllm_fuzz.json
    # compare metroline with the corpus (no vLLM needed)
    PYTHONPATH=.. python bench/vllm_fuzz.py
    # one case, request by request
    PYTHONPATH=.. python bench/vllm_fuzz.py --case 123 --show

`tests/test_vllm_fuzz.py` replays the corpus.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import vllm_matrix as matrix  # noqa: E402  (metroline's replay under the preset, vLLM's engine flags)

CORPUS = HERE.parent / "tests" / "data" / "vllm_fuzz.json"
BLOCK_SIZE = 16
STEP_TIME = 0.01
MAX_MODEL_LEN = 8192


def log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    return min(hi, max(lo, int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1))))))


def draw_case(seed: int) -> dict:
    """The case of `seed`: its `engine` table (as `vllm_reference.engine_fields` names it) and its
    `requests`, each `[arrival_s, [[segment key, length], ...], output_len, priority]`."""
    rng = random.Random(seed)
    budget = log_uniform(rng, 16, 4096)
    chunked = rng.random() >= 0.15
    max_model_len = MAX_MODEL_LEN if chunked else budget  # vLLM: no chunking needs budget >= max_model_len
    spec = None
    if rng.random() < 0.45:
        spec = {"method": "ngram", "num_speculative_tokens": rng.randint(1, 5),
                "acceptance_rate": round(rng.uniform(0.0, 1.0), 2), "seed": rng.randint(0, 999)}
    chunk = None
    if rng.random() < 0.4:
        chunk = min(log_uniform(rng, 1, budget), max_model_len)
    policy = rng.choice(("fcfs", "priority"))
    k = spec["num_speculative_tokens"] if spec else 0

    n = log_uniform(rng, 1, 40)
    # a few hundred steps at most: prompts of about 40 budgets and outputs of about 600 tokens in all
    longest = min(max_model_len - 1, rng.choice((24, 64, 256, 1000, 2000)), max(8, 40 * budget // n))
    max_out = max(1, min(longest // 2, rng.choice((4, 16, 64, 200)), 600 // n))
    prefixes = [(f"f{seed}p{j}", rng.randint(1, max(1, longest // 2))) for j in range(rng.randint(0, 3))]
    share = rng.random()
    levels = rng.randint(1, 6)
    burst = rng.random() < 0.3
    rate = 10 ** rng.uniform(0, 3)  # requests per second
    t, requests = 0.0, []
    for i in range(n):
        if not burst:
            t += rng.expovariate(rate)
            if rng.random() < 0.3:
                t = round(t, 2)  # on a step boundary, sometimes with another request
        out = rng.randint(1, max_out)
        segments = []
        room = max_model_len - out
        if prefixes and rng.random() < share:
            key, length = rng.choice(prefixes)
            segments.append([key, min(length, room - 1)])
        own = rng.randint(1, max(1, min(longest, room) - sum(s[1] for s in segments)))
        segments.append([f"f{seed}r{i}", own])
        segments = [s for s in segments if s[1] > 0]
        requests.append([round(t, 6), segments, out, rng.randrange(levels) if policy == "priority" else 0])

    totals = [sum(s[1] for s in segs) + out for _, segs, out, _ in requests]
    least = -(-(max(totals) + k + 1) // BLOCK_SIZE) + 1  # the largest request and its drafts fit alone
    most = sum(-(-(x + k + 1) // BLOCK_SIZE) for x in totals) + 1
    num_blocks = log_uniform(rng, least, max(least, int(most * 1.2)))
    engine = {"num_blocks": num_blocks, "block_size": BLOCK_SIZE, "max_num_seqs": log_uniform(rng, 1, min(256, budget)),
              "max_num_batched_tokens": budget, "max_model_len": max_model_len, "step_time": STEP_TIME,
              "policy": policy, "max_prefill_chunk": chunk,
              "max_prefill_chunk_adaptive": chunk is not None and rng.random() < 0.25,
              "enable_prefix_caching": rng.random() < 0.6, "speculative_config": spec,
              "enable_chunked_prefill": chunked}
    return {"seed": seed, "engine": engine, "requests": requests}


def category(case: dict) -> str:
    """The case's kind, for the counts: speculation with or without the chunk cap, or neither;
    `-nochunking` when chunked prefill is off."""
    e = case["engine"]
    kind = "nospec" if not e.get("speculative_config") else ("spec-cap" if e.get("max_prefill_chunk") else "spec")
    return kind if e.get("enable_chunked_prefill", True) else f"{kind}-nochunking"


def workload_of(case: dict):
    """The case's requests as a metroline `Workload`."""
    from metroline.core.workloads.items import Workload, WorkloadItem

    items = [WorkloadItem(arrival_s=a, segments=tuple((key, length) for key, length in segs), output_len=out,
                          priority=prio) for a, segs, out, prio in case["requests"]]
    return Workload(name=f"fuzz-{case['seed']}", items=items)


def record_vllm(cases: list[dict]) -> list[dict]:
    """vLLM's side of each case (needs vLLM, see `vllm_reference`), added to it: `steps`,
    `preemptions`, per request `times` ([first scheduled, first token, finish]) and its
    `preempted` count, in request order, and `error` where vLLM's replay raised."""
    import tempfile

    import vllm_reference as ref

    ref.import_metroline()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(ref.TINY_MODEL))
        for i, case in enumerate(cases):
            if i and i % 100 == 0:
                print(f"vLLM: {i} cases", file=sys.stderr, flush=True)
            try:
                result = ref.replay(matrix.vllm_args(case["engine"]), workload_of(case), Path(tmp))
            except Exception as exc:  # noqa: BLE001  (a case vLLM cannot run is reported, not recorded)
                case["error"] = f"{type(exc).__name__}: {exc}"
                continue
            reqs = result["requests"]
            order = [str(i) for i in range(len(case["requests"]))]
            case.update(steps=result["steps"], preemptions=result["preemptions"],
                        times=[[reqs[r]["first_scheduled"][1], reqs[r]["first_token"][1], reqs[r]["finish"][1]]
                               for r in order],
                        preempted=[reqs[r]["preemptions"] for r in order])
    return cases


def compare(case: dict, **overrides) -> dict:
    """metroline's replay of `case` under `--preset vllm` against vLLM's recorded side: the
    requests whose times or preemptions differ (`differ`: id -> (metroline's, vLLM's)), both
    sides' steps and preemptions, and `identical`."""
    summary, times = matrix.replay_metroline(case, workload=workload_of(case), **overrides)
    records = summary["records"]
    differ = {}
    for i, (want, preempted) in enumerate(zip(case["times"], case["preempted"])):
        rid = str(i)
        got = times.get(rid)
        mine = (list(got) if got else None, records[rid].preemptions if rid in records else None)
        if mine != (want, preempted):
            differ[rid] = (mine, (want, preempted))
    steps, preemptions = (summary["steps"], case["steps"]), (summary["preemptions"], case["preemptions"])
    return {"differ": differ, "steps": steps, "preemptions": preemptions,
            "identical": not differ and steps[0] == steps[1] and preemptions[0] == preemptions[1]}


def report(cases: list[dict], show: bool = False) -> dict[str, list[int]]:
    """Compare every recorded case; print the identical counts per category and the seeds that
    differ. Returns {category: [identical, cases]}."""
    counts: dict[str, list[int]] = {}
    differing = []
    for case in cases:
        if "error" in case:
            continue
        try:
            r = compare(case)
        except Exception as exc:  # noqa: BLE001  (a configuration metroline refuses counts as a difference)
            r = {"identical": False, "differ": {}, "steps": None, "preemptions": None,
                 "error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
        c = counts.setdefault(category(case), [0, 0])
        c[0] += r["identical"]
        c[1] += 1
        if not r["identical"]:
            differing.append(case["seed"])
            if show:
                print(f"case {case['seed']} ({category(case)}): steps m/v {r['steps']}, "
                      f"preemptions m/v {r['preemptions']}{'  ' + r['error'] if 'error' in r else ''}")
                for rid, (mine, want) in sorted(r["differ"].items(), key=lambda kv: int(kv[0])):
                    print(f"  request {rid}: metroline {mine}  vLLM {want}")
    total = [sum(c[0] for c in counts.values()), sum(c[1] for c in counts.values())]
    for name in sorted(counts):
        print(f"{name:<22} {counts[name][0]:>5} / {counts[name][1]:<5} identical")
    print(f"{'all':<22} {total[0]:>5} / {total[1]:<5} identical")
    if differing:
        print(f"differing seeds: {' '.join(map(str, differing))}")
    return counts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--live", action="store_true", help="draw the cases and run vLLM's scheduler on them now")
    p.add_argument("--cases", type=int, default=1000, help="with --live: how many cases (default: %(default)s)")
    p.add_argument("--first-seed", type=int, default=0, help="with --live: the first case's seed")
    p.add_argument("--record", help="with --live: write the corpus (cases and vLLM's side) here")
    p.add_argument("--corpus", default=str(CORPUS), help="the corpus to compare with (default: %(default)s)")
    p.add_argument("--case", type=int, action="append", help="only the case of this seed (repeatable)")
    p.add_argument("--show", action="store_true", help="print the requests that differ")
    args = p.parse_args(argv)
    if args.live:
        wall = time.perf_counter()
        seeds = args.case or range(args.first_seed, args.first_seed + args.cases)
        cases = record_vllm([draw_case(s) for s in seeds])
        errors = [c for c in cases if "error" in c]
        print(f"vLLM: {len(cases)} cases in {time.perf_counter() - wall:.1f} s, {len(errors)} not run", file=sys.stderr)
        for c in errors:
            print(f"  case {c['seed']}: {c['error']}", file=sys.stderr)
        if args.record:
            import vllm

            doc = {"reference": f"vllm {vllm.__version__} v1 Scheduler, fake model runner (bench/vllm_reference.py)",
                   "cases": [c for c in cases if "error" not in c]}
            Path(args.record).write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    else:
        cases = json.loads(Path(args.corpus).read_text())["cases"]
        if args.case:
            cases = [c for c in cases if c["seed"] in args.case]
    report(cases, args.show)
    return 0


if __name__ == "__main__":
    sys.exit(main())
