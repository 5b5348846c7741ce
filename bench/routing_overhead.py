"""The `route` hook's cost per request: `Router.choose` over the views of 8 replicas, for each
shipped router, in the simulated cluster and at the front of `metroline serve --replicas`.

Simulated cluster: views of 8 engines that hold requests and a warm prefix cache, sharing the
cluster's `PrefixDirectory` as `run_cluster` builds them (each replica's bit; the prompts run on a
replica recorded as routed there). What is timed is what the cluster pays per arriving request
beyond the replay itself: a new `RouteRequest`, the hook call through the router (answer checked),
the router's reads of the views and, for `prefix_aware`, its lookup in the directory (a
1,088-token prompt: 67 full blocks, the first 64 looked at; 3 of the 8 replicas were routed its
1,024-token prefix). `prefix_aware, new prompts` routes a new prompt object each call (made before the
timing, as a workload makes them): its chain is not known yet, and is assembled from that of its
shared prefix (the directory looks at its first 64 blocks only, so its user turn is not hashed). `prefix_aware, partial hit` routes a prompt that shares only 600 tokens (37 blocks) with what
was routed: the binary search of the directory runs its full course. `prefix_aware, ask_replicas`
is the option that asks each replica's cache instead of the directory (exact, slower).

Front: 8 `RemoteView`s sharing the front's directory, which was routed the salted blocks of 8
prompts per replica (two tenants; 3 of the 8 replicas were routed this tenant's 1,024-token
prefix). `front, salted` times what the front does on its event loop per request: the router over
a `RouteRequest` whose salted chain the front hashed with the tokenization, off the loop;
`front, record ...` what it adds when it sends the request (the directory learns the blocks of the
prompt it had not been routed: 4, or all 64); `front, hash a new prompt` the hashing done off the
loop per request (a new `SaltedPrompt` of 1,088 tokens, its first `MAX_ESTIMATE_BLOCKS` blocks).

Each figure is the best of `--repeats` (200) repetitions of `--calls` (500) calls, given twice:
the process's CPU time (`time.process_time`: what routing cost, without the waits for a core of an
oversubscribed machine) and wall time (`time.perf_counter`). Short repetitions, many of them: on a
machine whose cores (or their hyperthread siblings) are shared, other processes also slow the CPU
time of the code while they run beside it, and the best of many short windows is one that ran
alone.

Run:  python bench/routing_overhead.py [--replicas 8] [--calls 500] [--repeats 200] [--prompt 1024]
"""

from __future__ import annotations

import argparse
import random
import time

from metroline.core.cluster.prefix_directory import PrefixDirectory
from metroline.core.cluster.router import make_router
from metroline.core.cluster.view import Outstanding, ReplicaView, RouteRequest
from metroline.core.config import EngineConfig
from metroline.core.plugins.loader import ROUTERS
from metroline.core.serving.remote_view import RemoteView, SaltedPrompt
from metroline.core.step.engine import Engine
from metroline.core.workloads.items import PromptTokens, WorkloadItem


def replicas(n: int, prompt: int) -> tuple:
    """n replicas, each with a few requests waiting and a cached prefix (run to completion once),
    their views sharing a directory that was routed those prompts."""
    directory = PrefixDirectory(n * 2048)
    views = []
    for i in range(n):
        engine = Engine(EngineConfig(num_blocks=2048), "sim", retain_finished=False)
        outstanding = Outstanding()
        view = ReplicaView(i, f"r{i}", "long" if i == n - 1 else "default", "fcfs", engine, outstanding,
                           directory, 1 << i)
        for k in range(4):
            item = WorkloadItem(0.0, ((f"sys{i % 3}", prompt), (f"u{i}-{k}", 32)), 8)
            engine.add_request(item.request_data(f"{i}-{k}"))
            view.routed(RouteRequest(f"{i}-{k}", 0.0, item.prompt_token_ids(), 8))
        engine.run()
        for k in range(i):
            outstanding.add(f"q{k}", 100 * (k + 1))
        for k in range(3):
            item = WorkloadItem(1.0, ((f"w{i}-{k}", 64),), 8)
            engine.add_request(item.request_data(f"w{i}-{k}"))
            view.routed(RouteRequest(f"w{i}-{k}", 1.0, item.prompt_token_ids(), 8))
        views.append(view)
    return tuple(views)


REPEATS = 200


def timed(call, calls: int, fresh=None) -> tuple[float, float]:
    """(CPU, wall) microseconds per call of `call`, best of `REPEATS` repetitions of `calls` calls
    (the least disturbed: on a busy machine, other processes only ever add time). With `fresh`,
    each repetition calls `call(x)` for each x of `fresh(calls)`, made before it is timed."""
    wall = cpu = float("inf")
    for _ in range(REPEATS):
        if fresh is not None:
            items = fresh(calls)
            t, c = time.perf_counter(), time.process_time()
            for x in items:
                call(x)
        else:
            t, c = time.perf_counter(), time.process_time()
            for _ in range(calls):
                call()
        cpu = min(cpu, (time.process_time() - c) / calls)
        wall = min(wall, (time.perf_counter() - t) / calls)
    return cpu * 1e6, wall * 1e6


def show(name: str, figures: tuple[float, float], note: str = "") -> None:
    print(f"  {name:<32} {figures[0]:7.2f} us CPU {figures[1]:7.2f} us wall{note}")


def front_views(n: int, prompt: list[int]) -> tuple[tuple[RemoteView, ...], list[int]]:
    """n front views of replicas (block size 16) sharing one directory, replica i with i
    outstanding requests and the salted blocks of 8 routed prompts (two tenants); replicas 1, 4, 7
    were routed this prompt's prefix for tenant `alpha`. Returns the views and the prompt (its last
    64 tokens new)."""
    rng = random.Random(0)
    shared = prompt[:-64]
    directory = PrefixDirectory(65536 * n)
    views = []
    for i in range(n):
        view = RemoteView(i, f"r{i}", "default", prefix_directory=directory)
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
    global REPEATS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=REPEATS)
    ap.add_argument("--prompt", type=int, default=1024)
    args = ap.parse_args()
    REPEATS = args.repeats
    calls = args.calls
    views = replicas(args.replicas, args.prompt)
    item = WorkloadItem(2.0, (("sys1", args.prompt), ("user", 64)), 16)
    prompt = item.prompt_token_ids()
    print(f"route per request, {args.replicas} replicas, {len(prompt)}-token prompt "
          f"(best of {REPEATS} x {calls:,} calls; a new RouteRequest each call, as the cluster makes):")
    for name in ROUTERS:
        choose = make_router(name).choose
        show(name, timed(lambda: choose(RouteRequest("x", 2.0, prompt, 16), views), calls))
    # A new prompt object each call, as a workload's requests (made before the timing): its chain
    # is not on it yet, so it is assembled from its segments' (the shared prefix's is known).
    choose = make_router("prefix_aware").choose
    segments, vocab = prompt.segments, prompt.vocab_size
    show("prefix_aware, new prompts", timed(
        lambda p: choose(RouteRequest("x", 2.0, p, 16), views), calls,
        lambda k: [PromptTokens(prompt, segments, vocab) for _ in range(k)]))
    partial = WorkloadItem(2.0, (("sys1", 600), ("other", args.prompt - 600 + 64)), 16).prompt_token_ids()
    chosen = choose(RouteRequest("x", 2.0, partial, 16), views)
    show("prefix_aware, partial hit", timed(lambda: choose(RouteRequest("x", 2.0, partial, 16), views), calls),
         f" (chose r{chosen})")
    exact = make_router("prefix_aware", {"ask_replicas": True}).choose
    show("prefix_aware, ask_replicas", timed(lambda: exact(RouteRequest("x", 2.0, prompt, 16), views), calls))
    fronts, tokens = front_views(args.replicas, list(prompt))
    directory = fronts[0].prefix_directory
    size, most = directory.block_size, directory.max_blocks

    def hashed(prompt_tokens: list[int]) -> RouteRequest:
        request = RouteRequest("x", 2.0, SaltedPrompt(prompt_tokens, "alpha"), 16)
        request.block_chain(size, most)  # as `Front._route_request` does, off the event loop
        return request

    request = hashed(tokens)
    chosen = choose(request, fronts)
    show("front, salted", timed(lambda: choose(request, fronts), calls), f" (chose r{chosen})")
    rng = random.Random(1)
    view = fronts[1]
    # a prompt whose last 4 of its 64 estimated blocks are new (the others were routed here), and
    # one all new: the directory learns 4 and 64 blocks
    cut = (most - 4) * size
    show("front, record 4 new blocks", timed(view.routed, calls, lambda k: [
        hashed(tokens[:cut] + [rng.randrange(50_000) for _ in range(len(tokens) - cut)]) for _ in range(k)]))
    show("front, record 64 new blocks", timed(view.routed, calls // 10, lambda k: [
        hashed([rng.randrange(50_000) for _ in tokens]) for _ in range(k)]))
    show("front, hash a new prompt", timed(hashed, calls // 10, lambda k: [list(tokens)] * k),
         " (off the event loop, with the tokenization)")


if __name__ == "__main__":
    main()
