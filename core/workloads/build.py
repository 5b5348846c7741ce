"""Workloads: what arrives when, with which prompt and how many output tokens.

`build_workload` is the one entry point: a built-in name, a synthetic spec file, a trace file or
a request file becomes a `Workload`, cut to `max_requests` and scaled (`scale_items`). The parts
live in their own modules, whose public names this module also exports:

- `workload_items`: `WorkloadItem`, `Workload`, `WorkloadError`, the size limits;
- `token_streams`: the prompt tokens of `(key, length)` segments (`segment_tokens`);
- `workload_specs`: `SyntheticSpec`, its length distributions and tenant tables (`TenantSpec`), `load_spec`;
- `workload_generators`: `generate` (a spec's requests) and the built-ins (`BUILTIN_WORKLOADS`);
- `traces`: the Azure CSV and Mooncake JSONL readers, `find_traces_dir`;
- `text_requests`: request files with text prompts.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from . import text_requests
from .generators import (
    BUILTIN_WORKLOADS,
    SYNTHETIC_BUILTINS,
    TRACE_FILES,
    builtin_items,
    generate,
    list_workloads,
)
from .items import MAX_ITEM_TOKENS, MAX_REQUESTS, Workload, WorkloadError, WorkloadItem
from .resample import parse_method
from .resample import resample as draw
from .specs import (
    FixedLength,
    LengthDist,
    LognormalLength,
    SyntheticSpec,
    TenantSpec,
    UniformLength,
    load_spec,
    spec_namespace,
)
from .token_streams import segment_tokens
from .traces import find_traces_dir, load_azure, load_mooncake, load_trace

__all__ = [
    "BUILTIN_WORKLOADS", "MAX_ITEM_TOKENS", "MAX_REQUESTS", "FixedLength", "LengthDist", "LognormalLength",
    "SyntheticSpec", "TenantSpec", "UniformLength", "Workload", "WorkloadError", "WorkloadItem", "build_workload",
    "find_traces_dir", "generate", "list_workloads", "load_azure", "load_mooncake", "load_spec", "load_trace",
    "scale_items", "segment_tokens",
]


def scale_items(
    items: list[WorkloadItem], rate_scale: float = 1.0, length_scale: float = 1.0
) -> list[WorkloadItem]:
    """Arrivals divided by `rate_scale` (2.0 doubles the rate); every segment length and output
    length multiplied by `length_scale` (rounded, at least 1), so shared prefixes stay shared."""
    if rate_scale == 1.0 and length_scale == 1.0:
        return list(items)
    longest = max((max(it.output_len, *(n for _, n in it.segments)) for it in items), default=0)
    if longest * length_scale > MAX_ITEM_TOKENS:
        raise WorkloadError(
            f"length_scale {length_scale:g}: a length of {longest} tokens would become "
            f"{longest * length_scale:.4g}, above the limit of {MAX_ITEM_TOKENS}"
        )
    latest = max((it.arrival_s for it in items), default=0.0)
    if not math.isfinite(latest / rate_scale):
        raise WorkloadError(f"rate_scale {rate_scale:g}: the arrival at {latest:g} s overflows the clock")

    def scaled(n: int) -> int:
        return max(1, round(n * length_scale))

    return [
        WorkloadItem(
            it.arrival_s / rate_scale,
            tuple((key, scaled(n)) for key, n in it.segments) if length_scale != 1.0 else it.segments,
            scaled(it.output_len) if length_scale != 1.0 else it.output_len,
            it.tenant,
            it.priority,
            it.deadline_s,
        )
        for it in items
    ]


def build_workload(
    source: str,
    *,
    seed: int | None = None,
    rate_scale: float = 1.0,
    length_scale: float = 1.0,
    max_requests: int | None = None,
    groups: int | None = None,
    traces_dir: str | Path | None = None,
    tokenizer: Any = None,
    resample: str = "redraw",
) -> Workload:
    """Build a workload from a built-in name (see `BUILTIN_WORKLOADS`) or a file path.

    Files: `.csv` (Azure trace), `.jsonl` (Mooncake trace, or a request file with prompts: see
    `metroline.core.workloads.text_requests`; its text prompts need `tokenizer`), `.toml` / `.json` (a `SyntheticSpec`).
    `seed` drives the synthetic built-ins (default 0); for a spec file, a seed given here
    overrides the file's (None: the file's own). A spec file's requests depend on its content, not
    on its name (`spec_namespace`). A trace is replayed as recorded when `seed` is None, and
    resampled with `seed` otherwise, by the method `resample` ("redraw", "window:SECONDS" or "gamma:B", see
    `metroline.core.workloads.resample`). The seed used is in `params["seed"]` (absent for a trace as recorded).
    `groups` is for `mixed-64` only. Then, for any source: the first `max_requests` by arrival are
    kept and `rate_scale` / `length_scale` applied (`scale_items`).
    """
    method, window_s = parse_method(resample)
    if not (isinstance(rate_scale, (int, float)) and math.isfinite(rate_scale) and rate_scale > 0):
        raise WorkloadError(f"rate_scale must be a number > 0, got {rate_scale!r}")
    if not (isinstance(length_scale, (int, float)) and math.isfinite(length_scale) and length_scale > 0):
        raise WorkloadError(f"length_scale must be a number > 0, got {length_scale!r}")
    if max_requests is not None and max_requests < 1:
        raise WorkloadError(f"max_requests must be >= 1, got {max_requests}")
    if groups is not None and source != "mixed-64":
        raise WorkloadError(f"groups applies to the mixed-64 workload only, not {source!r}")
    if groups is not None and not 1 <= groups <= MAX_REQUESTS // 64:
        raise WorkloadError(f"groups must be in [1, {MAX_REQUESTS // 64}] (64 requests each), got {groups}")

    params: dict[str, Any] = {"source": source}
    is_trace = False
    if source in SYNTHETIC_BUILTINS:
        name, description, seed = source, BUILTIN_WORKLOADS[source], seed or 0
        params["seed"] = seed
        if source == "mixed-64":
            params["groups"] = groups = groups or 10
            items = builtin_items(source, seed, groups)
        else:
            items = builtin_items(source, seed, limit=max_requests)
    elif source in TRACE_FILES:
        name, description = source, BUILTIN_WORKLOADS[source]
        path = find_traces_dir(traces_dir) / TRACE_FILES[source]
        params["path"] = str(path)
        items = load_trace(path)
        is_trace = True
    else:
        path = Path(source)
        suffix = path.suffix.lower()
        if suffix not in (".csv", ".jsonl", ".toml", ".json"):
            raise WorkloadError(
                f"unknown workload {source!r}: not a built-in ({', '.join(BUILTIN_WORKLOADS)}) "
                "nor a .csv, .jsonl, .toml or .json file"
            )
        if not path.is_file():
            raise WorkloadError(f"workload file {source} does not exist")
        name = path.stem
        if suffix == ".jsonl" and text_requests.is_request_file(path):
            return text_requests.request_workload(
                path, tokenizer, rate_scale=rate_scale, length_scale=length_scale, max_requests=max_requests
            )
        if suffix in (".toml", ".json"):
            spec = load_spec(path)
            if seed is not None:
                spec = spec.model_copy(update={"seed": seed})
            description = f"synthetic workload from {path.name}"
            params["seed"] = spec.seed
            params["spec"] = spec.model_dump(mode="json")
            namespace = spec_namespace(spec)
            if max_requests is not None and max_requests < spec.num_requests:
                # arrivals only grow and each attribute has its own stream: the first k requests
                # of a spec are those of the same spec with k requests, so make no more
                spec = spec.model_copy(update={"num_requests": max_requests})
            items = generate(spec, namespace=namespace)
        else:
            description = f"trace {path.name}"
            items = load_trace(path)
            is_trace = True
    if is_trace and seed is not None:
        params.update(seed=seed, resample=resample)
        items = draw(items, seed, method, window_s)

    items = sorted(items, key=lambda it: it.arrival_s)
    if max_requests is not None:
        items = items[:max_requests]
    items = scale_items(items, rate_scale, length_scale)
    params.update(rate_scale=rate_scale, length_scale=length_scale, max_requests=max_requests)
    return Workload(name, items, description, params)
