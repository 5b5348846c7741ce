"""Workload generators: `generate` (the requests of a `SyntheticSpec`) and the built-in
workloads (`BUILTIN_WORKLOADS`: chat, chat-steady, mixed-64, shared-prefix, long-burst, and the names of the
shipped trace files, which `metroline.core.workloads.traces` reads).
"""

from __future__ import annotations

import math
import random

from .items import WorkloadError, WorkloadItem
from .specs import SyntheticSpec, share_of


def generate(spec: SyntheticSpec, *, namespace: str = "synthetic") -> list[WorkloadItem]:
    """The requests of `spec`, deterministic for its seed.

    `namespace` goes into the segment keys: workloads of different namespaces share no tokens.
    """
    n, seed = spec.num_requests, spec.seed

    def rng(stream: str) -> random.Random:
        return random.Random(f"{namespace}/{seed}/{stream}")

    arrivals = [0.0] * n
    if spec.rate is not None:
        r, t = rng("arrival"), 0.0
        for i in range(1, n):
            if spec.arrival == "poisson":
                t += r.expovariate(spec.rate)
            else:
                t += r.gammavariate(spec.burstiness, 1.0 / (spec.rate * spec.burstiness))
            arrivals[i] = t
        if not math.isfinite(t):
            raise WorkloadError(f"rate {spec.rate!r}: arrivals overflow the clock (give a larger rate)")
    names = list(spec.tenants)
    tenants = rng("tenant").choices(names, [share_of(spec.tenants[t]) for t in names], k=n)
    # each request draws its lengths from its tenant's distributions, from one stream per length
    # (so a spec without per-tenant lengths draws what it drew before tenants could have their own)
    lengths = {t: spec.lengths_of(t) for t in names}
    r_prompt, r_out = rng("prompt_len"), rng("output_len")
    prompts = [lengths[t][0].sample(r_prompt) for t in tenants]
    outputs = [lengths[t][1].sample(r_out) for t in tenants]
    priorities = rng("priority").choices(list(spec.priorities), list(spec.priorities.values()), k=n)
    prefixes = rng("prefix").choices(range(spec.num_prefixes), k=n)

    items = []
    for i in range(n):
        own = (("req", namespace, seed, i), prompts[i])
        if spec.shared_prefix_len:
            segments = ((("sys", namespace, seed, prefixes[i]), spec.shared_prefix_len), own)
        else:
            segments = (own,)
        items.append(WorkloadItem(arrivals[i], segments, outputs[i], tenants[i], priorities[i]))
    return items



# The default engine (max_num_seqs 256) under the `steps` cost model (0.01 s a step) finishes
# 256 requests every 128 steps at the chat workload's mean of 128 output tokens.
_CHAT_CAPACITY = 256 / (128 * 0.01)
_CHAT_RATE = round(1.1 * _CHAT_CAPACITY, 6)
# `compare`'s default: chat's requests offered where the policies differ, at about 0.8 x the
# default engine's capacity under the default roofline cost model as the load check estimates it
# (`metroline compare --workload chat --rate-scale 0.165 --max-requests 1500`: 0.82 x 45.7 req/s;
# at 0.16, 0.74 x; from 0.17 requests wait most of the time and the estimate is the saturated one)
_CHAT_STEADY_REQUESTS = 1500
_CHAT_STEADY_RATE = round(0.165 * _CHAT_RATE, 6)

BUILTIN_WORKLOADS: dict[str, str] = {
    "chat": (
        f"4000 chat requests, poisson at {_CHAT_RATE:g} req/s = 1.1 x the default engine's capacity "
        f"under the steps cost model (max_num_seqs 256 / (mean output 128 tokens x 0.01 s a step) "
        f"= {_CHAT_CAPACITY:g} req/s); prompt = one of 4 shared 128-token system prompts + "
        "lognormal(mean 256, sigma 0.8, 16..4096) tokens; output lognormal(mean 128, sigma 0.8, "
        "4..1024); tenants alpha/beta/gamma 50/30/20 %; priorities 0/1 20/80 %"
    ),
    "chat-steady": (
        f"{_CHAT_STEADY_REQUESTS} requests drawn as chat's, poisson at {_CHAT_STEADY_RATE:g} req/s = about 0.8 x "
        "the default engine's capacity under the default roofline cost model (the load check's "
        "estimate), where the policies differ; the default workload of `metroline compare`"
    ),
    "mixed-64": (
        "groups (default 10) of 64 requests, group g all arriving at t = 0.1 g s; per group 54 "
        "short (20 output tokens) and 10 long (2000) in shuffled order; unique 64-token prompts"
    ),
    "shared-prefix": (
        "200 requests, poisson at 50 req/s, sharing one 1000-token system prompt, each with a "
        "unique 32-token suffix and 32 output tokens"
    ),
    "long-burst": (
        "600 short chats (tenant 'chat', poisson 20 req/s, 256 prompt / 256 output tokens) plus "
        "16 requests with unique 8192-token prompts and 16 output tokens (tenant 'burst') all "
        "arriving at t = 10 s"
    ),
    "azure-conv": "Azure LLM inference trace 2023, conversation service (19,366 requests)",
    "azure-code": "Azure LLM inference trace 2023, code-completion service (8,819 requests)",
    "mooncake": "Mooncake (FAST'25) synthetic trace with prefix-sharing block ids (3,993 requests)",
}

TRACE_FILES = {
    "azure-conv": "azure_conv_2023.csv",
    "azure-code": "azure_code_2023.csv",
    "mooncake": "mooncake_synthetic.jsonl",
}
"""The file of each built-in trace workload, in the traces folder (`traces.find_traces_dir`)."""


def list_workloads() -> list[str]:
    """The names of the built-in workloads."""
    return list(BUILTIN_WORKLOADS)


def _chat(seed: int, num_requests: int = 4000, rate: float = _CHAT_RATE, limit: int | None = None) -> list[WorkloadItem]:
    spec = SyntheticSpec(
        num_requests=min(num_requests, limit or num_requests),
        rate=rate,
        prompt_len={"dist": "lognormal", "mean": 256, "sigma": 0.8, "min": 16, "max": 4096},
        output_len={"dist": "lognormal", "mean": 128, "sigma": 0.8, "min": 4, "max": 1024},
        tenants={"alpha": 0.5, "beta": 0.3, "gamma": 0.2},
        priorities={0: 0.2, 1: 0.8},
        shared_prefix_len=128,
        num_prefixes=4,
        seed=seed,
    )
    return generate(spec, namespace="chat")


MIXED_64_GROUP_INTERVAL_S = 0.1


def _mixed_64(seed: int, groups: int) -> list[WorkloadItem]:
    rng = random.Random(f"mixed-64/{seed}")
    items = []
    for g in range(groups):
        outputs = [20] * 54 + [2000] * 10
        rng.shuffle(outputs)
        for j, out in enumerate(outputs):
            items.append(WorkloadItem(g * MIXED_64_GROUP_INTERVAL_S, ((("mixed-64", seed, g * 64 + j), 64),), out))
    return items


def _chat_steady(seed: int, limit: int | None = None) -> list[WorkloadItem]:
    return _chat(seed, _CHAT_STEADY_REQUESTS, _CHAT_STEADY_RATE, limit)


def _shared_prefix(seed: int, limit: int | None = None) -> list[WorkloadItem]:
    spec = SyntheticSpec(
        num_requests=min(200, limit or 200), rate=50.0, prompt_len=32, output_len=32, shared_prefix_len=1000, seed=seed
    )
    return generate(spec, namespace="shared-prefix")


def _long_burst(seed: int) -> list[WorkloadItem]:
    chats = SyntheticSpec(
        num_requests=600, rate=20.0, prompt_len=256, output_len=256, tenants={"chat": 1}, seed=seed
    )
    burst = [
        WorkloadItem(10.0, ((("long-burst", seed, i), 8192),), 16, tenant="burst") for i in range(16)
    ]
    return generate(chats, namespace="long-burst") + burst


def builtin_items(name: str, seed: int, groups: int = 10, limit: int | None = None) -> list[WorkloadItem]:
    """The requests of the synthetic built-in `name` (chat, chat-steady, mixed-64, shared-prefix, long-burst)
    for `seed`; `groups` is mixed-64's number of groups. With `limit`, the built-ins drawn from one
    spec (chat, chat-steady, shared-prefix) make only their first `limit` requests, which are the
    first `limit` by arrival of the whole workload (arrivals only grow and each attribute has its
    own random stream); the others make all of theirs."""
    if name == "mixed-64":
        return _mixed_64(seed, groups)
    if name == "long-burst":
        return _long_burst(seed)
    builders = {"chat": _chat, "chat-steady": _chat_steady, "shared-prefix": _shared_prefix}
    return builders[name](seed, limit=limit)


SYNTHETIC_BUILTINS = ("chat", "chat-steady", "mixed-64", "shared-prefix", "long-burst")
"""The built-ins `builtin_items` makes (the others are trace files, `TRACE_FILES`)."""
