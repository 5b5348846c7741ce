"""The default sampler's cost per step on a logits tensor, by kind of batch.

Rows: `--batch` sequences (default 64) with 200-token prompts and 100 output tokens each,
logits `[batch, --vocab]` (default 49152, SmolLM2's) in float32 on `--device`, drawn as
5 x N(0, 1): peaked like a language model's (the top 1024 tokens hold about 99% of the mass, so
top_p needs no full sort). For each mix it
prints the median milliseconds of one `Sampler.sample` call (the whole default hook: grouping,
masks, penalties, filters, draws, the final `.tolist()`).

Run:  python bench/sampler.py [--batch 64] [--vocab 49152] [--device cpu] [--repeats 20] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from metroline.core.requests.request import SamplingParams
from metroline.core.requests.sequence import Sequence
from metroline.executors.torch.sampling import TorchSampler as Sampler

MIXES = {
    "greedy": lambda i: dict(temperature=0.0),
    "temperature": lambda i: dict(temperature=0.8),
    "top_k+top_p": lambda i: dict(temperature=0.8, top_k=50, top_p=0.9),
    "min_p": lambda i: dict(temperature=0.8, min_p=0.05),
    "seeded": lambda i: dict(temperature=0.8, seed=i),
    "penalties": lambda i: dict(temperature=0.8, repetition_penalty=1.1, frequency_penalty=0.3),
    "1/4 top_p, rest greedy": lambda i: dict(temperature=0.8, top_p=0.9) if i % 4 == 0 else dict(temperature=0.0),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    logits = (5.0 * torch.randn(args.batch, args.vocab, generator=gen)).to(args.device)
    history = torch.randint(0, args.vocab, (args.batch, 300), generator=gen).tolist()
    print(f"batch {args.batch}, vocab {args.vocab}, {args.device}: ms per sample() call (median of {args.repeats})")
    for name, params in MIXES.items():
        seqs = []
        for i in range(args.batch):
            s = Sequence(f"r{i}", history[i][:200], SamplingParams(**params(i)), 0.0)
            s.token_ids.extend(history[i][200:])
            seqs.append(s)
        sampler = Sampler()
        sampler.sample(seqs, logits)  # warm-up
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            sampler.sample(seqs, logits)
            if args.device != "cpu":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        print(f"  {name:<24} {1000 * statistics.median(times):8.2f}")


if __name__ == "__main__":
    main()
