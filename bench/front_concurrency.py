"""The front of `metroline serve --replicas 2` under bursts of concurrent streams, against one of its
replicas asked directly: every answer's status (a 502 on a healthy replica is a failure), and the
client's TTFT percentiles both ways, whose difference is the front's overhead at that load.

Each run opens `--streams` streamed completions at once (connections kept alive in one httpx
pool, as the `openai` client's), first through the front, then straight to replica r0 with half
as many (the front splits its burst between two replicas); `--runs` runs. The simulated executor
runs in real time (`steps` cost model, `--step-time`).

Run:  python bench/front_concurrency.py [--runs 10] [--streams 320] [--tokens 32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import httpx
from serve_process import start_serve

ROOT = Path(os.environ.get("METROLINE_ROOT") or Path(__file__).resolve().parents[2])


def start(step_time: float) -> tuple[subprocess.Popen, str]:
    return start_serve(["--replicas", "2", "--cost-model", "steps", "--step-time", str(step_time)], str(ROOT),
                       "the front")


async def one(client: httpx.AsyncClient, url: str, i: int, tokens: int) -> tuple[str, float]:
    body = {"prompt": f"burst request {i}", "max_tokens": tokens, "stream": True, "ignore_eos": True}
    t0 = time.monotonic()
    ttft = float("nan")
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as r:
            if r.status_code != 200:
                message = json.loads(await r.aread()).get("error", {}).get("message", "")
                return f"{r.status_code} {message[:70]}", ttft
            async for line in r.aiter_lines():
                if line.startswith("data: {") and ttft != ttft:
                    ttft = time.monotonic() - t0
                if '"error"' in line:
                    return "error event", ttft
        return "200", ttft
    except httpx.TransportError as exc:
        return type(exc).__name__, ttft


async def burst(url: str, streams: int, tokens: int) -> list[tuple[str, float]]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=1024)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        return await asyncio.gather(*(one(client, url, i, tokens) for i in range(streams)))


def pct(xs: list[float], q: float) -> float:
    xs = sorted(x for x in xs if x == x)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1e3 if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--streams", type=int, default=320)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--step-time", type=float, default=0.01)
    args = ap.parse_args()
    proc, url = start(args.step_time)
    try:
        replica = httpx.get(url + "/v1/replicas").json()["replicas"][0]["url"]
        statuses: Counter = Counter()
        print(f"{args.runs} runs of {args.streams} concurrent streams of {args.tokens} tokens through the front "
              f"of 2 replicas ({args.step_time * 1e3:g} ms a step), then {args.streams // 2} straight to one replica")
        print(f"  {'run':>3} {'front p50':>10} {'p99':>8} {'direct p50':>11} {'p99':>8}  statuses (front)")
        for run in range(args.runs):
            front = asyncio.run(burst(url, args.streams, args.tokens))
            direct = asyncio.run(burst(replica, args.streams // 2, args.tokens))
            statuses.update(s for s, _ in front)
            f, d = [t for _, t in front], [t for _, t in direct]
            print(f"  {run:>3} {pct(f, .5):8.1f}ms {pct(f, .99):6.1f}ms {pct(d, .5):9.1f}ms {pct(d, .99):6.1f}ms  "
                  f"{dict(Counter(s for s, _ in front))}")
        print(f"  all runs: {dict(statuses)}")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


if __name__ == "__main__":
    main()
