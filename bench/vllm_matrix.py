"""The referee matrix: `--preset vllm` against vLLM 0.33's own v1 scheduler, cell by cell.

Cells: token budgets 256, 512 and 2,048 x a block pool with preemption ("tight": a few requests'
worth of blocks) and one without ("roomy") x vLLM's `fcfs` and `priority` policies x the chunk cap
(`--max-prefill-chunk`, vLLM's `long_prefill_token_threshold`: a quarter of the budget) off and on
x prefix caching on and off, on the first 40 requests of the Azure conversation, Azure code and
Mooncake traces (arrivals compressed so that they contend; Mooncake's lengths scaled by 1/8). Under
`priority` each request gets a priority of 0, 1 or 2 (seeded draws, the same on both sides).

For each cell: the share of requests whose first-scheduled, first-token and finish times are
bit-equal, and the preemptions on both sides.

    # compare with the recording in tests/data/ (no vLLM needed; the traces are)
    PYTHONPATH=.. python bench/vllm_matrix.py
    # vLLM's side live (the venv of bench/vllm_reference.py's docstring), and re-record it
    /work/vllm-venv/bin/python bench/vllm_matrix.py --live --record tests/data/vllm_matrix.json

`tests/test_vllm_matrix.py` replays the recording cell by cell.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RECORDING = HERE.parent / "tests" / "data" / "vllm_matrix.json"
TRACES = {  # workload modifiers and the two pools (blocks of 16 tokens)
    "azure-conv": {"max_requests": 40, "rate_scale": 10.0, "length_scale": 1.0, "tight": 300, "roomy": 4000},
    "azure-code": {"max_requests": 40, "rate_scale": 10.0, "length_scale": 1.0, "tight": 500, "roomy": 8000},
    "mooncake": {"max_requests": 40, "rate_scale": 5.0, "length_scale": 0.125, "tight": 480, "roomy": 8000},
}
BUDGETS = (256, 512, 2048)
MAX_NUM_SEQS = 16
PRIORITY_SEED = 27


def cells() -> list[dict]:
    """Every cell of the matrix, in a fixed order."""
    return [
        {"trace": t, "budget": b, "pool": p, "policy": pol, "chunk": c, "prefix": x}
        for t, b, p, pol, c, x in itertools.product(
            TRACES, BUDGETS, ("tight", "roomy"), ("fcfs", "priority"), (False, True), (True, False)
        )
    ]


def cell_name(cell: dict) -> str:
    return (f"{cell['trace']}-{cell['budget']}-{cell['pool']}-{cell['policy']}"
            f"-{'chunk' if cell['chunk'] else 'nochunk'}-{'prefix' if cell['prefix'] else 'noprefix'}")


def cell_engine(cell: dict) -> dict:
    """The engine's fields (the recordings' `engine` table, see `vllm_reference.engine_fields`)."""
    budget = cell["budget"]
    return {"num_blocks": TRACES[cell["trace"]][cell["pool"]], "block_size": 16, "max_num_seqs": MAX_NUM_SEQS,
            "max_num_batched_tokens": budget, "max_model_len": 32768, "step_time": 0.01,
            "policy": cell["policy"], "max_prefill_chunk": budget // 4 if cell["chunk"] else None,
            "max_prefill_chunk_adaptive": False, "enable_prefix_caching": cell["prefix"]}


def cell_workload_params(cell: dict) -> dict:
    t = TRACES[cell["trace"]]
    return {"source": cell["trace"], "seed": None, "max_requests": t["max_requests"],
            "rate_scale": t["rate_scale"], "length_scale": t["length_scale"]}


def cell_priorities(cell: dict) -> list[int] | None:
    if cell["policy"] != "priority":
        return None
    rng = random.Random(PRIORITY_SEED)
    return [rng.choice((0, 1, 2)) for _ in range(TRACES[cell["trace"]]["max_requests"])]


def workload_of(recording: dict, traces_dir=None):
    """The recording's workload, its items given the recorded priorities."""
    import dataclasses

    from metroline.core.workloads.build import build_workload

    w = recording["workload"]
    workload = build_workload(w["source"], seed=w["seed"], max_requests=w["max_requests"], rate_scale=w["rate_scale"],
                              length_scale=w["length_scale"], traces_dir=traces_dir)
    if recording.get("priorities"):
        workload.items = [dataclasses.replace(it, priority=p) for it, p in zip(workload.items, recording["priorities"])]
    return workload


def metroline_config(recording: dict, **overrides):
    """The `EngineConfig` under `--preset vllm` of the recording's `engine` table (fields as
    `vllm_reference.engine_fields` names them), with `overrides` on top."""
    from metroline.core.config import EngineConfig

    e = recording["engine"]
    fields = {k: e[k] for k in ("num_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len")}
    fields.update(policy=e.get("policy", "fcfs"), max_prefill_chunk=e.get("max_prefill_chunk"),
                  enable_prefix_caching=e.get("enable_prefix_caching", True))
    if e.get("max_prefill_chunk_adaptive"):
        fields["max_prefill_chunk_adaptive"] = True
    if e.get("speculative_config"):
        fields["speculative_config"] = e["speculative_config"]
    if e.get("enable_chunked_prefill") is False:
        fields["enable_chunked_prefill"] = False
    return EngineConfig(preset="vllm", **{**fields, **overrides})


def replay_metroline(recording: dict, traces_dir=None, workload=None, **overrides) -> tuple[dict, dict[str, tuple]]:
    """Run the recording's workload (or `workload`) under `--preset vllm` with its engine; the
    summary (with the `speculation` counters under speculative decoding, and `records`: each
    request's `RequestRecord`) and each request's (first scheduled, first token, finish) times."""
    from metroline.core.experiments.runner import run_workload
    from metroline.executors.cost_models import make_cost_model
    from metroline.executors.simulated import SimulatedExecutor

    cfg = metroline_config(recording, **overrides)
    doc, engine = run_workload(workload or workload_of(recording, traces_dir), cfg,
                               SimulatedExecutor(make_cost_model("steps", step_time=recording["engine"]["step_time"])))
    records = {r.id: r for r in engine.metrics.requests}
    times = {rid: (r.first_scheduled_s, r.first_token_s, r.finish_s) for rid, r in records.items()}
    summary = {**doc["summary"], "records": records}
    if "speculation" in doc:  # speculative decoding's counters beside the summary's figures
        summary["speculation"] = doc["speculation"]
    return summary, times


def recorded_times(recording: dict) -> dict[str, tuple]:
    return {rid: tuple(t) for rid, t in recording["times"].items()}


def compare(recording: dict, traces_dir=None) -> dict:
    """One cell: the share of requests bit-equal in each time, and both sides' preemptions."""
    summary, times = replay_metroline(recording, traces_dir)
    want = recorded_times(recording)
    n = len(want)
    same = [sum(times.get(rid, (None,) * 3)[k] == want[rid][k] for rid in want) for k in range(3)]
    return {"requests": n, "first_scheduled": 100 * same[0] / n, "first_token": 100 * same[1] / n,
            "finish": 100 * same[2] / n, "preemptions": (summary["preemptions"], recording["preemptions"])}


def vllm_args(engine: dict) -> argparse.Namespace:
    """`vllm_reference`'s engine flags for a recording's `engine` table."""
    e = engine
    return argparse.Namespace(
        num_blocks=e["num_blocks"], block_size=e["block_size"], max_num_seqs=e["max_num_seqs"],
        max_batched_tokens=e["max_num_batched_tokens"], max_model_len=e["max_model_len"],
        step_time=e["step_time"], policy=e["policy"], max_prefill_chunk=e.get("max_prefill_chunk"),
        max_prefill_chunk_adaptive=e.get("max_prefill_chunk_adaptive", False),
        no_prefix_sharing=not e["enable_prefix_caching"], speculative_config=e.get("speculative_config"),
        no_chunked_prefill=e.get("enable_chunked_prefill") is False)


def replay_vllm(ref, rec: dict, model_dir: Path, traces_dir=None) -> dict:
    """vLLM's side of the cell recording `rec` (its workload and `engine` table), added to `rec`:
    preemptions, steps, each request's times (and vLLM's drafts under speculative decoding)."""
    result = ref.replay(vllm_args(rec["engine"]), workload_of(rec, traces_dir), model_dir)
    rec.update(preemptions=result["preemptions"], steps=result["steps"], times={
        rid: [r["first_scheduled"][1], r["first_token"][1], r["finish"][1]] for rid, r in result["requests"].items()})
    if "drafts" in result:
        rec["drafts"] = result["drafts"]
    return rec


def record_cells(selected: list[dict], traces_dir=None, make_record=None) -> list[dict]:
    """vLLM's side of each cell (needs vLLM, see `vllm_reference`); `make_record(cell)` gives a
    cell's recording without it (default: this matrix's)."""
    import tempfile

    sys.path.insert(0, str(HERE))
    import vllm_reference as ref

    ref.import_metroline()
    make_record = make_record or (lambda cell: {"cell": cell, "workload": cell_workload_params(cell),
                                                "engine": cell_engine(cell), "priorities": cell_priorities(cell)})
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(ref.TINY_MODEL))
        return [replay_vllm(ref, make_record(cell), Path(tmp), traces_dir) for cell in selected]


def recordings_of(args: argparse.Namespace, all_cells: list[dict], name_of, reference: str, make_record=None) -> list[dict]:
    """The cells' recordings: vLLM's side run now (`--live`, written to `--record`), or read from
    `--recording`; only the cells whose name contains `--only`."""
    if not args.live:
        return [r for r in json.loads(Path(args.recording).read_text())["cells"]
                if not args.only or args.only in name_of(r["cell"])]
    selected = [c for c in all_cells if not args.only or args.only in name_of(c)]
    wall = time.perf_counter()
    recordings = record_cells(selected, getattr(args, "traces_dir", None), make_record)
    print(f"vLLM: {len(recordings)} cells in {time.perf_counter() - wall:.1f} s", file=sys.stderr)
    if args.record:
        import vllm

        Path(args.record).write_text(json.dumps({"reference": f"vllm {vllm.__version__} {reference}",
                                                 "cells": recordings}, separators=(",", ":")) + "\n")
    return recordings


def report(recordings: list[dict], name_of, traces_dir=None, width: int = 48, extra=None) -> int:
    """Compare each recording with metroline's replay and print a line per cell (`extra(rec)`:
    a last column); then how many cells are identical. Returns 0."""
    print(f"{'cell':<{width}} {'n':>3} {'sched%':>7} {'ttft%':>7} {'end%':>7} {'preempt m/v':>12}")
    full = 0
    for rec in recordings:
        r = compare(rec, traces_dir)
        m, v = r["preemptions"]
        ok = r["first_scheduled"] == r["first_token"] == r["finish"] == 100 and m == v
        full += ok
        print(f"{name_of(rec['cell']):<{width}} {r['requests']:>3} {r['first_scheduled']:>7.2f} "
              f"{r['first_token']:>7.2f} {r['finish']:>7.2f} {m:>5}/{v:<5}{extra(rec) if extra else ''}"
              f"{'' if ok else '  DIFF'}")
    print(f"{full}/{len(recordings)} cells identical (every time bit-equal, equal preemptions)")
    return 0


def check_identical(recording: dict, traces_dir=None) -> dict:
    """Assert that metroline's replay of `recording` is vLLM's: every request's times bit-equal,
    equal preemption and step counts. Returns the replay's summary."""
    summary, times = replay_metroline(recording, traces_dir)
    want = recorded_times(recording)
    assert times.keys() == want.keys()
    assert {rid: (times[rid], want[rid]) for rid in want if times[rid] != want[rid]} == {}
    assert (summary["preemptions"], summary["steps"]) == (recording["preemptions"], recording["steps"])
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--live", action="store_true", help="run vLLM's scheduler now instead of reading the recording")
    p.add_argument("--record", help="with --live: write vLLM's side here")
    p.add_argument("--recording", default=str(RECORDING), help="the recording to compare with (default: %(default)s)")
    p.add_argument("--only", help="the cells whose name contains this")
    p.add_argument("--traces-dir")
    args = p.parse_args(argv)
    recordings = recordings_of(args, cells(), cell_name,
                               "v1 Scheduler, fake model runner (bench/vllm_reference.py)")
    return report(recordings, cell_name, args.traces_dir)

if __name__ == "__main__":
    sys.exit(main())
