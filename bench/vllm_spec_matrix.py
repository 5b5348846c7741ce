"""The speculative referee matrix: `--preset vllm` with speculative decoding against vLLM 0.33's
own v1 scheduler with the same `speculative_config`, cell by cell.

vLLM's side is `bench/vllm_reference.py`'s replay with its fake model runner as drafter and
verifier: after each step every request that sampled proposes `num_speculative_tokens` drafts
(vLLM's `update_draft_token_ids`), and of the drafts a step verifies it accepts as many as
metroline's simulated executor does (`metroline.executors.speculation_sim.AcceptanceModel`:
seeded, per request and position), so both sides see the same acceptances.

Cells: the built-in `chat` workload (40 requests arriving within 0.2 s) and a burst of 40
`shared-prefix` requests (one 1,000-token system prompt) x token budgets 256, 512 and 2,048 x a
block pool with preemption ("tight") and one without ("roomy") x two speculative configs (n-gram,
2 drafts accepted at 0.8; 5 drafts at 0.4) x vLLM's `fcfs` and `priority` policies x prefix
caching on and off. Under `priority` each request gets a priority of 0, 1 or 2 (seeded draws, the
same on both sides). For each cell: the share of requests whose first-scheduled, first-token and
finish times are bit-equal, and the preemptions on both sides.

    # compare with the recording in tests/data/ (no vLLM needed)
    PYTHONPATH=.. python bench/vllm_spec_matrix.py
    # vLLM's side live (the venv of bench/vllm_reference.py's docstring), and re-record it
    /work/vllm-venv/bin/python bench/vllm_spec_matrix.py --live --record tests/data/vllm_spec_matrix.json

`tests/test_vllm_spec_matrix.py` replays the recording cell by cell.
"""

from __future__ import annotations

import argparse
import itertools
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import vllm_matrix as matrix  # noqa: E402  (the cell comparison and metroline's replay)

RECORDING = HERE.parent / "tests" / "data" / "vllm_spec_matrix.json"
WORKLOADS = {  # workload modifiers and the two pools (blocks of 16 tokens)
    "chat": {"max_requests": 40, "rate_scale": 1.0, "tight": 120, "roomy": 4000},
    "shared-prefix": {"max_requests": 40, "rate_scale": 1000.0, "tight": 90, "roomy": 4000},
}
BUDGETS = (256, 512, 2048)
SPECS = {  # metroline's SpeculativeConfig (vLLM's shape plus the simulator's acceptance)
    "k2": {"method": "ngram", "num_speculative_tokens": 2, "acceptance_rate": 0.8, "seed": 3},
    "k5": {"method": "ngram", "num_speculative_tokens": 5, "acceptance_rate": 0.4, "seed": 5},
}
MAX_NUM_SEQS = 16
PRIORITY_SEED = 29


def cells() -> list[dict]:
    """Every cell of the matrix, in a fixed order."""
    return [
        {"workload": w, "budget": b, "pool": p, "spec": s, "policy": pol, "prefix": x}
        for w, b, p, s, pol, x in itertools.product(
            WORKLOADS, BUDGETS, ("tight", "roomy"), SPECS, ("fcfs", "priority"), (True, False)
        )
    ]


def cell_name(cell: dict) -> str:
    return (f"{cell['workload']}-{cell['budget']}-{cell['pool']}-{cell['spec']}-{cell['policy']}"
            f"-{'prefix' if cell['prefix'] else 'noprefix'}")


def cell_engine(cell: dict) -> dict:
    """The engine's fields (the recordings' `engine` table, see `vllm_reference.engine_fields`)."""
    return {"num_blocks": WORKLOADS[cell["workload"]][cell["pool"]], "block_size": 16, "max_num_seqs": MAX_NUM_SEQS,
            "max_num_batched_tokens": cell["budget"], "max_model_len": 32768, "step_time": 0.01,
            "policy": cell["policy"], "max_prefill_chunk": None, "max_prefill_chunk_adaptive": False,
            "enable_prefix_caching": cell["prefix"], "speculative_config": SPECS[cell["spec"]]}


def cell_record(cell: dict) -> dict:
    """A cell's recording without vLLM's side: the cell, its workload, engine and priorities."""
    w = WORKLOADS[cell["workload"]]
    priorities = None
    if cell["policy"] == "priority":
        rng = random.Random(PRIORITY_SEED)
        priorities = [rng.choice((0, 1, 2)) for _ in range(w["max_requests"])]
    return {"cell": cell, "workload": {"source": cell["workload"], "seed": None, "max_requests": w["max_requests"],
                                       "rate_scale": w["rate_scale"], "length_scale": 1.0},
            "engine": cell_engine(cell), "priorities": priorities}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--live", action="store_true", help="run vLLM's scheduler now instead of reading the recording")
    p.add_argument("--record", help="with --live: write vLLM's side here")
    p.add_argument("--recording", default=str(RECORDING), help="the recording to compare with (default: %(default)s)")
    p.add_argument("--only", help="the cells whose name contains this")
    args = p.parse_args(argv)
    recordings = matrix.recordings_of(
        args, cells(), cell_name, "v1 Scheduler with speculative decoding, fake model runner (bench/vllm_reference.py)",
        cell_record)
    return matrix.report(recordings, cell_name, width=46, extra=lambda rec: f" pad {rec['drafts']['num_padding_drafts']}")

if __name__ == "__main__":
    sys.exit(main())
