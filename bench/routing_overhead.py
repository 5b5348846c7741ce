"""The `route` hook's cost per request in the simulator: `Router.choose` over live views of 8
replicas (engines that hold requests and a warm prefix cache), for each shipped router.

What is timed is what the cluster pays per arriving request beyond the replay itself: the hook
call through the router (answer checked), the router's reads of the views, and, for
`prefix_aware`, the prompt's block hashes (once per prompt; a workload prompt shares those of the
segments it has in common with earlier prompts) and its prefix-cache probes on each replica
within the load bound (a 1,088-token prompt: 67 full blocks; 3 of the 8 replicas hold its
1,024-token prefix). Best of 5 repetitions of `--calls` calls each; `prefix_aware, new prompts`
routes a new prompt object each call, whose chain is not known yet (its shared prefix's is).

`front, salted, new prompts` is the front's path (`metroline.core.serving.front`): 8 `RemoteView`s
whose prefix estimate remembers the salted blocks routed to each (two tenants; 3 of the 8 replicas
were routed this tenant's 1,024-token prefix), and a new `SaltedPrompt` each call (made in the
timed loop), hashed from its tenant's salt (at most `MAX_ESTIMATE_BLOCKS` blocks).

Each figure is given twice: wall time (`time.perf_counter`) and the thread's CPU time
(`time.thread_time`): on a machine whose cores are oversubscribed, wall time also counts the time
the process waited for a core; CPU time is what routing cost.

Run:  python bench/routing_overhead.py [--replicas 8] [--calls 20000] [--prompt 1024]
"""

from __future__ import annotations

import argparse
import random
import time

from metroline.core.cluster.router import make_router
from metroline.core.cluster.view import Outstanding, ReplicaView, RouteRequest
from metroline.core.config import EngineConfig
from metroline.core.plugins.loader import ROUTERS
from metroline.core.serving.remote_view import RemoteView, SaltedPrompt
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


def timed(call, calls: int) -> tuple[float, float]:
    """(wall, CPU) microseconds per call of `call`, best of 5 repetitions of `calls` calls."""
    wall = cpu = float("inf")
    for _ in range(5):
        t, c = time.perf_counter(), time.thread_time()
        for _ in range(calls):
            call()
        wall = min(wall, (time.perf_counter() - t) / calls)
        cpu = min(cpu, (time.thread_time() - c) / calls)
    return wall * 1e6, cpu * 1e6


def front_views(n: int, prompt: list[int]) -> tuple[tuple[RemoteView, ...], list[int]]:
    """n front views of replicas (block size 16), replica i with i outstanding requests and the
    salted blocks of 8 routed prompts (two tenants); replicas 1, 4, 7 were routed this prompt's
    prefix for tenant `alpha`. Returns the views and the prompt (its last 64 tokens new)."""
    rng = random.Random(0)
    shared = prompt[:-64]
    views = []
    for i in range(n):
        view = RemoteView(i, f"r{i}", "default")
        view.update({"block_size": 16})
        for k in range(i):
            view.outstanding.add(f"q{k}", 100 * (k + 1))
        for tenant in ("alpha", "beta"):
            for _ in range(4):
                mine = i % 3 == 1 and tenant == "alpha"
                head = shared if mine else [rng.randrange(50_000) for _ in shared]
                tokens = SaltedPrompt(head + [rng.randrange(50_000) for _ in range(64)], tenant)
                view.routed(RouteRequest("w", 0.0, tokens, 16))
        views.append(view)
    return tuple(views), shared + [rng.randrange(50_000) for _ in range(64)]


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
        choose = make_router(name).choose
        wall, cpu = timed(lambda: choose(RouteRequest("x", 2.0, prompt, 16), views), args.calls)
        print(f"  {name:<28} {wall:7.2f} us wall {cpu:7.2f} us CPU")
    # A new prompt object each call, as a workload's requests: its chain is not on it yet, so its
    # own blocks (the user turn's) are hashed and those of the shared prefix reused.
    choose = make_router("prefix_aware").choose
    segments, vocab = prompt.segments, prompt.vocab_size
    wall, cpu = timed(lambda: choose(RouteRequest("x", 2.0, PromptTokens(prompt, segments, vocab), 16), views),
                      args.calls)
    print(f"  {'prefix_aware, new prompts':<28} {wall:7.2f} us wall {cpu:7.2f} us CPU")
    fronts, tokens = front_views(args.replicas, list(prompt))
    chosen = choose(RouteRequest("x", 2.0, SaltedPrompt(tokens, "alpha"), 16), fronts)
    wall, cpu = timed(lambda: choose(RouteRequest("x", 2.0, SaltedPrompt(tokens, "alpha"), 16), fronts), args.calls)
    print(f"  {'front, salted, new prompts':<28} {wall:7.2f} us wall {cpu:7.2f} us CPU (chose r{chosen})")


if __name__ == "__main__":
    main()
