"""The `route` hook's cost per request in the simulator: `Router.choose` over live views of 8
replicas (engines that hold requests and a warm prefix cache), for each shipped router.

What is timed is what the cluster pays per arriving request beyond the replay itself: the hook
call through the router (answer checked), the router's reads of the views, and, for
`prefix_aware`, the prompt's block hashes (once per prompt; a workload prompt shares those of the
segments it has in common with earlier prompts) and its prefix-cache probes on each replica
within the load bound (a 1,088-token prompt: 67 full blocks; 3 of the 8 replicas hold its
1,024-token prefix). Best of 5 repetitions of `--calls` calls each; `prefix_aware, new prompts`
routes a new prompt object each call, whose chain is not known yet (its shared prefix's is).

Run:  python bench/routing_overhead.py [--replicas 8] [--calls 20000] [--prompt 1024]
"""

from __future__ import annotations

import argparse
import time

from metroline.core.cluster.router import make_router
from metroline.core.cluster.view import Outstanding, ReplicaView, RouteRequest
from metroline.core.config import EngineConfig
from metroline.core.plugins.loader import ROUTERS
from metroline.core.step.engine import Engine
from metroline.core.workloads.items import PromptTokens, WorkloadItem


def replicas(n: int, prompt: int) -> tuple:
    """n replicas, each with a few requests waiting and a cached prefix (run to completion once)."""
    views = []
    for i in range(n):
        engine = Engine(EngineConfig(num_blocks=2048), "sim", retain_finished=False)
        for k in range(4):
            engine.add_request(WorkloadItem(0.0, ((f"sys{i % 3}", prompt), (f"u{i}-{k}", 32)), 8).request_data(f"{i}-{k}"))
        engine.run()
        outstanding = Outstanding()
        for k in range(i):
            outstanding.add(f"q{k}", 100 * (k + 1))
        for k in range(3):
            engine.add_request(WorkloadItem(1.0, ((f"w{i}-{k}", 64),), 8).request_data(f"w{i}-{k}"))
        views.append(ReplicaView(i, f"r{i}", "long" if i == n - 1 else "default", "fcfs", engine, outstanding))
    return tuple(views)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--calls", type=int, default=20_000)
    ap.add_argument("--prompt", type=int, default=1024)
    args = ap.parse_args()
    views = replicas(args.replicas, args.prompt)
    item = WorkloadItem(2.0, (("sys1", args.prompt), ("user", 64)), 16)
    prompt = item.prompt_token_ids()
    print(f"route per request, {args.replicas} replicas, {len(prompt)}-token prompt "
          f"(best of 5 x {args.calls:,} calls; a new RouteRequest each call, as the cluster makes):")
    for name in ROUTERS:
        router = make_router(name)
        choose = router.choose
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(args.calls):
                choose(RouteRequest("x", 2.0, prompt, 16), views)
            best = min(best, (time.perf_counter() - t) / args.calls)
        print(f"  {name:<26} {best * 1e6:7.2f} us")
    # A new prompt object each call, as a workload's requests: its chain is not on it yet, so its
    # own blocks (the user turn's) are hashed and those of the shared prefix reused. Each call is
    # timed alone (the prompt made, hot in cache, before the clock runs, as the cluster makes it
    # just before routing), the clock's own cost included.
    choose = make_router("prefix_aware").choose
    clock, segments, vocab = time.perf_counter, prompt.segments, prompt.vocab_size
    best = float("inf")
    for _ in range(5):
        total = 0.0
        for _ in range(args.calls):
            fresh = PromptTokens(prompt, segments, vocab)
            t = clock()
            choose(RouteRequest("x", 2.0, fresh, 16), views)
            total += clock() - t
        best = min(best, total / args.calls)
    print(f"  {'prefix_aware, new prompts':<26} {best * 1e6:7.2f} us  (a new prompt object each call)")

if __name__ == "__main__":
    main()
