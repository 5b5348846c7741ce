"""The code one FCFS step runs: the metroline files and functions a steady-state `Engine.step` touches.

An engine with the `fcfs` policy on the simulated executor holds `--running` requests in steady
decode (slots full) and `--waiting` more behind them (admission looks at the queue and admits
nothing). After `--warmup` steps, one `Engine.step` is traced with `sys.setprofile`: every Python
function call whose code lives in the imported `metroline` package counts (generators and
properties included; C functions and the standard library do not). It prints the number of
distinct files and functions, the number of calls (a deterministic measure of the step's work
that a busy machine does not blur), and with `--list` each function, by file.

Run:  python bench/trace_step.py [--running 4] [--waiting 4] [--warmup 20] [--list]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict


def traced_step(running: int, waiting: int, warmup: int) -> tuple[dict[str, set[str]], int]:
    """file (relative to the package) -> the qualified names of its functions that one step called;
    and how many calls of them the step made."""
    import metroline
    from metroline.core.config import EngineConfig
    from metroline.core.requests.request import Request, SamplingParams
    from metroline.core.step.engine import Engine

    root = os.path.dirname(os.path.abspath(metroline.__file__)) + os.sep
    blocks = running * (-(-(16 + warmup + 64) // 16) + 1)  # every running request to its last token
    config = EngineConfig(policy="fcfs", max_num_seqs=running, max_num_batched_tokens=512, num_blocks=max(blocks, 256),
                          block_size=16, max_model_len=1024)
    engine = Engine(config)
    sampling = SamplingParams(max_new_tokens=warmup + 64, ignore_eos=True, temperature=0.0)
    for i in range(running + waiting):
        engine.add_request(Request(request_id=f"r{i}", prompt_token_ids=[1000 + 37 * i + j for j in range(16)],
                                   sampling=sampling))
    for _ in range(warmup):
        engine.step()
    s = engine.scheduler
    assert len(s.running) == running and len(s.waiting) == waiting, "not in steady state"
    touched: dict[str, set[str]] = defaultdict(set)
    calls = [0]

    def profile(frame, event, arg):  # noqa: ANN001
        if event == "call":
            code = frame.f_code
            if code.co_filename.startswith(root):
                calls[0] += 1
                name = getattr(code, "co_qualname", code.co_name)
                touched[code.co_filename[len(root):]].add(f"{name}:{code.co_firstlineno}")

    sys.setprofile(profile)
    try:
        engine.step()
    finally:
        sys.setprofile(None)
    return touched, calls[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--running", type=int, default=4)
    parser.add_argument("--waiting", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--list", action="store_true", help="print every file and function")
    args = parser.parse_args()
    touched, calls = traced_step(args.running, args.waiting, args.warmup)
    functions = sum(len(f) for f in touched.values())
    print(f"one fcfs step ({args.running} running, {args.waiting} waiting): "
          f"{len(touched)} files, {functions} functions, {calls} calls")
    if args.list:
        for path in sorted(touched):
            print(f"  {path} ({len(touched[path])}): {', '.join(sorted(n.split(':')[0] for n in touched[path]))}")


if __name__ == "__main__":
    main()
