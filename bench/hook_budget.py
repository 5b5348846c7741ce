"""A plugin that sleeps for an hour on one tenant's requests (`tests/hang_plugins.py`), against
`metroline serve` (a real process on 127.0.0.1, the simulated executor in real time): how long the
offending request takes to fail, the worst inter-token gap of another tenant's concurrent streams,
the longest `/health` answer meanwhile, and the server's resident memory from `/metrics`.

Run:  python bench/hook_budget.py [--budget 1.0] [--streams 3] [--tokens 400]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import httpx
from serve_process import start_serve

import metroline

ROOT = Path(metroline.__file__).parent.parent
TESTS = Path(__file__).resolve().parent.parent / "tests"  # hang_plugins
CONFIG = """
[serve]
operator_keys = ["sk-op"]
[serve.tenants.alpha]
api_keys = ["sk-alpha"]
[serve.tenants.beta]
api_keys = ["sk-beta"]
"""


def stream(url: str, tokens: int, i: int, gaps: list[float], started: threading.Event) -> None:
    body = {"prompt": f"beta's stream {i}", "max_tokens": tokens, "stream": True, "ignore_eos": True}
    last = None
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120,
                      headers={"Authorization": "Bearer sk-beta"}) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                now = time.monotonic()
                if last is not None:
                    gaps.append(now - last)
                last = now
                started.set()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=1.0)
    ap.add_argument("--streams", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=400)
    ap.add_argument("--step-time", type=float, default=0.005)
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp())
    (folder / "serve.toml").write_text(CONFIG)
    proc, url = start_serve(["--config", str(folder / "serve.toml"), "--cost-model", "steps", "--step-time",
                             str(args.step_time), "--plugin", "hang_plugins:HangsForAlpha", "--hook-budget",
                             str(args.budget)], f"{ROOT}:{TESTS}", "the server")
    try:
        gaps: list[list[float]] = [[] for _ in range(args.streams)]
        events = [threading.Event() for _ in range(args.streams)]
        threads = [threading.Thread(target=stream, args=(url, args.tokens, i, gaps[i], events[i]))
                   for i in range(args.streams)]
        for t in threads:
            t.start()
        for e in events:
            e.wait(60)
        health: list[float] = []
        done = threading.Event()

        def poll() -> None:
            while not done.is_set():
                t0 = time.monotonic()
                httpx.get(url + "/health", timeout=60)
                health.append(time.monotonic() - t0)
                time.sleep(0.05)

        poller = threading.Thread(target=poll)
        poller.start()
        t0 = time.monotonic()
        r = httpx.post(url + "/v1/completions", json={"prompt": "alpha", "max_tokens": 5}, timeout=120,
                       headers={"Authorization": "Bearer sk-alpha"})
        failed_after = time.monotonic() - t0
        for t in threads:
            t.join()
        done.set()
        poller.join()
        metrics = httpx.get(url + "/metrics", headers={"Authorization": "Bearer sk-op"}).text
        rss = next(float(line.split()[1]) for line in metrics.splitlines()
                   if line.startswith("process_resident_memory_bytes"))
        worst = max(max(g) for g in gaps if g)
        print(f"hook budget {args.budget:g} s: alpha's request answered {r.status_code} after {failed_after:.2f} s "
              f"({r.json()['error']['message'][:120]}...)")
        print(f"beta's {args.streams} streams of {args.tokens} tokens: {sum(len(g) + 1 for g in gaps)} events, "
              f"worst gap {worst * 1000:.0f} ms; /health: {len(health)} answers, longest {max(health) * 1000:.0f} ms; "
              f"server RSS {rss / 2**20:.1f} MiB")
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    main()
