"""The conformance suite's workloads and engine: the built-in overloaded workloads, an author's
own workload, tenants re-labelled, and the small KV pool that forces preemption
(`metroline.testing.check_plugin` runs on these)."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..config import EngineConfig
from ..workloads.build import SyntheticSpec, Workload, build_workload, generate


def with_tenants(workload: Workload, tenants: Iterable[str] | Mapping[str, float], seed: int = 0) -> Workload:
    """`workload` with its requests' tenants replaced by `tenants`: a list of names gives request
    i (by arrival) to tenant `i mod len(tenants)`; a {name: share} mapping draws each request's
    tenant by share (seeded by `seed` and the workload's name)."""
    names = _tenant_names(tenants)
    items = workload.items
    if isinstance(tenants, Mapping):
        shares = [float(tenants[n]) for n in names]
        if not all(share >= 0 for share in shares) or sum(shares) <= 0:
            raise ValueError(f"tenant shares must be >= 0 with a positive sum, got {dict(tenants)!r}")
        labels = random.Random(f"check_plugin/{workload.name}/{seed}").choices(names, shares, k=len(items))
    else:
        labels = [names[i % len(names)] for i in range(len(items))]
    relabelled = [dataclasses.replace(it, tenant=label) for it, label in zip(items, labels)]
    return Workload(workload.name, relabelled, workload.description, {**workload.params, "tenants": names})


def _tenant_names(tenants: Iterable[str] | Mapping[str, float]) -> list[str]:
    if isinstance(tenants, str):
        raise ValueError(f"tenants must be a list of names, not the string {tenants!r}")
    names = list(tenants)
    if not names or not all(isinstance(n, str) and n for n in names) or len(set(names)) != len(names):
        raise ValueError(f"tenants must be distinct non-empty names, got {names!r}")
    return names


def own_workload(workload: Workload | SyntheticSpec | Mapping[str, Any] | str | Path) -> Workload:
    """The author's workload for `check_plugin(workload=...)`: a `Workload` as is; a
    `SyntheticSpec` (or its dict) generated; a string or path built by `build_workload` (a
    built-in name, a trace, a request file or a spec file)."""
    if isinstance(workload, Workload):
        return workload
    if isinstance(workload, Mapping):
        workload = SyntheticSpec.model_validate(dict(workload))
    if isinstance(workload, SyntheticSpec):
        items = generate(workload, namespace="check-plugin")
        return Workload("own", items, "the author's synthetic workload", {"spec": workload.model_dump(mode="json")})
    if isinstance(workload, (str, Path)):
        return build_workload(str(workload))
    raise TypeError(f"workload must be a Workload, a SyntheticSpec or its dict, or a name or path, got {workload!r:.80}")


def conformance_workloads(seed: int = 0) -> list[Workload]:
    """The built-in workloads of the suite: small, overloaded, with tenants, priorities, shared
    prefixes, a long-prompt burst and parallel sampling is left to the engine tests."""
    chat = SyntheticSpec(
        num_requests=160, rate=400.0, prompt_len={"dist": "lognormal", "mean": 96, "sigma": 0.8, "min": 4, "max": 384},
        output_len={"dist": "lognormal", "mean": 48, "sigma": 0.8, "min": 1, "max": 256},
        tenants={"alpha": 0.5, "beta": 0.3, "gamma": 0.2}, priorities={0: 0.2, 1: 0.6, 2: 0.2},
        shared_prefix_len=32, num_prefixes=3, seed=seed,
    )
    burst = SyntheticSpec(
        num_requests=60, rate=None, prompt_len={"dist": "uniform", "low": 200, "high": 700},
        output_len={"dist": "uniform", "low": 1, "high": 40}, tenants={"burst": 1.0}, seed=seed + 1,
    )
    mixed = build_workload("mixed-64", seed=seed, groups=2, length_scale=0.05)
    return [
        Workload("chat", generate(chat, namespace="conformance-chat"), "overloaded chat", {"seed": seed}),
        Workload("burst", generate(burst, namespace="conformance-burst"), "long prompts at once", {"seed": seed}),
        Workload("mixed", mixed.items, "mixed-64, 2 groups, lengths x0.05", {"seed": seed}),
    ]


def conformance_config(**overrides: Any) -> EngineConfig:
    """A small engine: a pool of 96 blocks of 16 tokens forces preemption on the suite's workloads."""
    fields: dict[str, Any] = dict(
        block_size=16, num_blocks=96, max_num_seqs=16, max_num_batched_tokens=256, max_model_len=1536,
        swap_space_blocks=48,
    )
    fields.update(overrides)
    return EngineConfig(**fields)
