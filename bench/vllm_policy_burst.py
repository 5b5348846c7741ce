"""A policy's effect inside a real vLLM engine: a burst of requests at once on SmolLM2 (CPU,
float32), served by vLLM's own scheduler, by metroline's bridge with `fcfs` and with `srpt`
(each request's `max_tokens` given as its expected output length, `vllm_xargs`:
`expected_output_tokens`, as `--oracle-lengths` does in the simulator); the mean and median
latency (send to last token) of each.

Mixed outputs: most requests short, a few long (seeded draws); `--max-num-seqs` small so that
requests queue and the admission order matters. Needs the venv of docs/guide/vllm.md:

    PYTHONPATH=.. /work/vllm-cpu-venv/bin/python bench/vllm_policy_burst.py --requests 48 --max-num-seqs 4
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "integration_vllm"))


def burst(seed: int, n: int) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    words = "the a river town night sea code light stone wind".split()
    return [(" ".join(rng.choice(words) for _ in range(rng.randint(4, 40))),
             rng.randint(150, 250) if rng.random() < 0.25 else rng.randint(4, 24)) for _ in range(n)]


def run(url: str, cases: list[tuple[str, int]]) -> list[float]:
    import openai

    client = openai.OpenAI(base_url=url, api_key="none", timeout=3600)
    client.completions.create(model="smollm2", prompt="warm up", max_tokens=2)

    def one(case):
        prompt, n = case
        t = time.perf_counter()
        r = client.completions.create(model="smollm2", prompt=prompt, max_tokens=n, temperature=0.0,
                                      extra_body={"ignore_eos": True, "vllm_xargs": {"expected_output_tokens": n}})
        assert r.usage.completion_tokens == n
        return time.perf_counter() - t

    with ThreadPoolExecutor(len(cases)) as pool:
        return list(pool.map(one, cases))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--max-num-seqs", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arms", default="vllm,fcfs,srpt", help="vllm (its own scheduler), or metroline policies")
    args = p.parse_args(argv)
    from vllm_server import vllm_model_folder, vllm_server

    from metroline.executors.torch.loader import model_folder

    tmp_models = tempfile.mkdtemp()
    folder = str(vllm_model_folder(model_folder("smollm2"), Path(tmp_models) / "smollm2"))
    cases = burst(args.seed, args.requests)
    print(f"{len(cases)} requests at once, output lengths {sorted(n for _, n in cases)}")
    for arm in args.arms.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "server.log"
            scheduler = None if arm == "vllm" else "metroline.integrations.vllm.MetrolineScheduler"
            stack = None if arm == "vllm" else {"policy": arm}
            with vllm_server(folder, stack, log, max_num_seqs=args.max_num_seqs, scheduler=scheduler) as url:
                wall = time.perf_counter()
                lat = run(url, cases)
                wall = time.perf_counter() - wall
        print(f"{arm:>5}: mean latency {statistics.mean(lat):.2f} s, median {statistics.median(lat):.2f} s, "
              f"max {max(lat):.2f} s, burst done in {wall:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
