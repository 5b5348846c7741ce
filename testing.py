"""Conformance checks for plugin authors: run a plugin on built-in workloads and check the contract.

In a test of the plugin's package::

    from metroline.testing import check_plugin

    def test_my_plugin_conforms():
        check_plugin("mypkg.quota:TenantQuota", options={"default_max_running": 4})

`check_plugin` runs the plugin (as the base policy when it answers `admission` itself, else stacked
on `base`) on small built-in workloads with a KV pool small enough to force preemption, in each
preemption mode, and checks at every step and after the drain:

- the step's tokens never exceed `max_num_batched_tokens`, running sequences never exceed
  `max_num_seqs`, every scheduled sequence is running and its tokens are within its known tokens;
- every victim is a running request (the engine itself rejects any other answer with a
  `PluginError`, which fails the check);
- the KV invariant holds after every step and, after the drain, every block is free or evictable;
- no request is lost: each ends with a reason, and those that ran to their length have exactly
  `max_new_tokens` tokens;
- each hook is called a bounded number of times per step (independent of the queue length);
- the results are deterministic for a fixed seed (two runs give identical request and step logs);
- the engine keeps making progress (a stuck engine raises `NoProgressError`).

It raises `ConformanceError` listing every failure, and returns a `ConformanceReport` otherwise.

Run it on your own tenants and workload, so that your plugin's own code paths run: the suite's
workloads have the tenants alpha, beta, gamma and burst, so a plugin keyed on tenant
"enterprise" would pass without any of its code doing anything::

    report = check_plugin("mypkg.quota:TenantQuota", tenants=["enterprise", "free"],
                          workload="my_traffic.toml", strict=True)
    print(report)  # runs, then each hook's calls and changed answers

`tenants=` re-labels the suite's workloads with your tenants (a list: request i of each workload
goes to tenant i mod len; a {name: share} mapping: a seeded draw by share); `workload=` adds your
own workload (a `Workload`, a `SyntheticSpec` or its dict, a built-in name or a file path) to the
suite's, with its own tenants. The report's `coverage` says, for each hook your plugin implements,
how many times it was called and how many times its answer changed the answer without it (see
`metroline.core.hook_coverage`); a hook that was never called, or never changed an answer, is a
warning in `report.warnings`, and a `ConformanceError` with `strict=True`.
"""

from __future__ import annotations

import dataclasses
import inspect
import random
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .core.config import EngineConfig
from .core.plugins import SHIPPED, resolve
from .core.plugin_loader import instantiate
from .core.engine import Engine
from .core.runner import replay, result_of
from .core.sequence import FinishReason, SeqState
from .core.victim_loop import REFUSALS_PER_STEP
from .core.workloads import SyntheticSpec, Workload, build_workload, generate
from .executors.cost_models import make_cost_model
from .executors.simulated import SimulatedExecutor
from .core.hook_coverage import HookCoverage, watch

PER_STEP_LIMITS: dict[str, int] = {
    "admission": 1,
    "split_budget": 1,
    "order_running": 1,
    "sample": 1,
    "on_arrival": 1,
    "on_admitted": 2,  # the step's admissions, and the siblings forked for n > 1
    "on_preempted": 1,
    "on_tokens": 1,
    "on_finished": 2,  # ended before the step (cancelled) and during it
    "on_step_end": 1,
}
"""How many times each hook may be called in one step. `select_victim` may be called once per
preemption or refusal (at most `REFUSALS_PER_STEP` for blocks and one for slots, whatever the
queue's length), so its bound is `2 * max_num_seqs + REFUSALS_PER_STEP + 1`."""


class ConformanceError(AssertionError):
    """A plugin broke the contract; the message lists every failure."""


@dataclass
class ConformanceReport:
    """What `check_plugin` ran and how it exercised the plugin.

    `runs`: one dict per run (workload, preemption mode, requests, steps, preemptions).
    `tenants`: the tenants the runs' requests had. `coverage`: hook name -> `HookCoverage` (calls
    and changed answers, summed over the runs) for every hook the plugin implements. `warnings`:
    one line per hook that was never called or never changed an answer.
    """

    plugin: str
    runs: list[dict[str, Any]] = field(default_factory=list)
    tenants: list[str] = field(default_factory=list)
    coverage: dict[str, HookCoverage] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"conformance of {self.plugin}: {len(self.runs)} runs passed (tenants: {', '.join(self.tenants)})"]
        for r in self.runs:
            lines.append(
                f"  {r['workload']:<12} {r['mode']:<9} requests={r['requests']} steps={r['steps']} "
                f"preemptions={r['preemptions']}"
            )
        lines.append("hooks of the plugin:")
        lines.extend(f"  {cov}" for _, cov in sorted(self.coverage.items()))
        lines.extend(f"warning: {w}" for w in self.warnings)
        return "\n".join(lines)


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


def _is_base_policy(target: Any) -> bool:
    fn = getattr(target, "admission", None)
    if fn is None:
        return False
    opts = getattr(fn, "metroline_impl", None)
    return opts is not None and not (opts.get("wrapper") or opts.get("hookwrapper"))


class _CheckingExecutor:
    """Wraps the simulated executor and checks every plan before it runs."""

    def __init__(self, inner: Any, failures: list[str]) -> None:
        self.inner = inner
        self.failures = failures
        self.engine: Any = None
        self.name = inner.name

    def now(self) -> float:
        return self.inner.now()

    def idle_until(self, t: float) -> None:
        self.inner.idle_until(t)

    def describe(self) -> dict:
        return self.inner.describe()

    def _fail(self, message: str) -> None:
        if len(self.failures) < 50:
            self.failures.append(message)

    def execute(self, plan: Any) -> Any:
        engine = self.engine
        config, scheduler = engine.config, engine.scheduler
        step = plan.step
        if plan.num_tokens > config.max_num_batched_tokens:
            self._fail(f"step {step}: {plan.num_tokens} tokens > max_num_batched_tokens {config.max_num_batched_tokens}")
        if len(scheduler.running) > config.max_num_seqs:
            self._fail(f"step {step}: {len(scheduler.running)} running > max_num_seqs {config.max_num_seqs}")
        for seq, n in plan.scheduled.items():
            if seq.state is not SeqState.RUNNING or seq not in scheduler.running:
                self._fail(f"step {step}: scheduled {seq!r} is not running")
            if n < 1 or seq.num_computed_tokens + n > len(seq.token_ids):
                self._fail(f"step {step}: {seq!r} scheduled {n} tokens beyond its known tokens")
        try:
            engine.pool.check_invariants([s.block_table for s in scheduler.running])
        except AssertionError as exc:
            self._fail(f"step {step}: KV invariant: {exc}")
        return self.inner.execute(plan)


def _run_once(
    workload: Workload, config: EngineConfig, extra: list[Any], failures: list[str],
    coverage: dict[str, HookCoverage] | None = None,
) -> tuple[dict[str, Any], Any, Counter]:
    executor = _CheckingExecutor(SimulatedExecutor(make_cost_model("steps")), failures)
    engine = Engine(config, executor, plugins=extra)
    executor.engine = engine
    if coverage is not None:  # the plugin under test is the last registered: the highest precedence
        watch(engine, engine.plugins.describe()[0][0], coverage)
    calls: Counter = Counter()

    def before(hook_name: str, impls: Any, kwargs: dict) -> None:
        ctx = kwargs.get("ctx")
        calls[(hook_name, ctx.step if ctx is not None else -1)] += 1

    def after(outcome: Any, hook_name: str, impls: Any, kwargs: dict) -> None:
        pass

    engine.plugins.monitor(before, after)
    wall_s = replay(engine, workload)
    return result_of(engine, workload, wall_s), engine, calls


def _check_drained(engine: Any, label: str, failures: list[str]) -> None:
    pool = engine.pool
    try:
        pool.check_invariants([])
    except AssertionError as exc:
        failures.append(f"{label}: KV invariant after drain: {exc}")
    if pool.num_used_blocks():
        failures.append(f"{label}: {pool.num_used_blocks()} blocks still used after every request ended")
    swap = engine.scheduler.swap
    if swap is not None and swap.num_free_blocks() != swap.num_blocks:
        failures.append(f"{label}: {swap.num_blocks - swap.num_free_blocks()} host blocks leaked")
    for rid, seqs in engine._requests.items():
        for seq in engine._all_seqs(seqs):
            if seq.finish_reason is None:
                failures.append(f"{label}: request {seq.seq_id} never ended (state {seq.state.name})")
            elif seq.finish_reason is FinishReason.LENGTH and seq.num_output_tokens != seq.sampling.max_new_tokens:
                failures.append(
                    f"{label}: request {seq.seq_id} ended for length with {seq.num_output_tokens} "
                    f"of {seq.sampling.max_new_tokens} tokens"
                )
            elif seq.finish_reason not in (FinishReason.LENGTH, FinishReason.EOS, FinishReason.STOP):
                failures.append(f"{label}: request {seq.seq_id} ended {seq.finish_reason} ({seq.error})")


def _check_calls(calls: Counter, config: EngineConfig, label: str, failures: list[str]) -> None:
    limits = dict(PER_STEP_LIMITS, select_victim=2 * config.max_num_seqs + REFUSALS_PER_STEP + 1)
    worst: dict[str, tuple[int, int]] = {}
    for (hook, step), n in calls.items():
        if n > worst.get(hook, (0, 0))[0]:
            worst[hook] = (n, step)
    for hook, (n, step) in sorted(worst.items()):
        limit = limits.get(hook)
        if limit is not None and n > limit:
            failures.append(f"{label}: hook {hook} called {n} times in step {step} (limit {limit})")


def _fingerprint(engine: Any) -> tuple:
    requests = tuple(r[:-1] for r in sorted(engine.metrics.requests))  # all but the error text
    steps = tuple(engine.metrics.steps)
    return requests, steps


def check_plugin(
    plugin: Any,
    *,
    options: dict[str, Any] | None = None,
    base: str = "fcfs",
    workloads: Iterable[Workload] | None = None,
    modes: Iterable[str] = ("recompute", "swap"),
    seed: int = 0,
    config: dict[str, Any] | None = None,
    tenants: Iterable[str] | Mapping[str, float] | None = None,
    workload: Workload | SyntheticSpec | Mapping[str, Any] | str | Path | None = None,
    strict: bool = False,
) -> ConformanceReport:
    """Run the conformance checks on `plugin` (a spec string, a plugin class or an instance).

    `options`: the plugin's options. `base`: the policy a non-policy plugin is stacked on.
    `workloads`: replaces the suite's built-in workloads. `tenants`: your tenant names (or
    {name: share}), given to the requests of the suite's workloads (`with_tenants`). `workload`:
    your own workload, run after the suite's, with its own tenants (`own_workload`). `config`:
    `EngineConfig` overrides for the runs. `strict`: a hook of the plugin that was never called
    or never changed an answer is a failure, not only a warning in the report.
    Raises `ConformanceError` on any failure.
    """
    options = dict(options or {})
    if isinstance(plugin, str):
        spec, target = plugin, resolve(plugin)
    else:
        target = plugin
        spec = getattr(plugin, "name", None) or getattr(plugin, "__name__", None) or type(plugin).__name__
    name = getattr(target, "name", None) or spec
    is_policy = _is_base_policy(target)

    def setup(mode: str) -> tuple[EngineConfig, list[Any]]:
        fields = dict(config or {}, preemption_mode=mode, seed=seed)
        if isinstance(plugin, str):
            fields["plugin_options"] = {name: options}
            if is_policy:
                return conformance_config(policy=spec, **fields), []
            return conformance_config(policy=base, plugins=[spec], **fields), []
        fields["policy"] = base
        obj = instantiate(spec, target, options)[1] if inspect.isclass(target) else target
        return conformance_config(**fields), [obj]

    report = ConformanceReport(name)
    failures: list[str] = []
    workload_list = list(workloads) if workloads is not None else conformance_workloads(seed)
    if tenants is not None:
        workload_list = [with_tenants(w, tenants, seed) for w in workload_list]
    if workload is not None:
        workload_list.append(own_workload(workload))
    report.tenants = sorted({it.tenant for w in workload_list for it in w.items})
    for wi, wl in enumerate(workload_list):
        for mode in modes:
            label = f"{name} on {wl.name} ({mode})"
            cfg, extra = setup(mode)
            try:
                doc, engine, calls = _run_once(wl, cfg, extra, failures, report.coverage)
            except Exception as exc:  # a PluginError, a stuck engine, a crash: all are failures
                failures.append(f"{label}: {type(exc).__name__}: {exc}")
                continue
            _check_drained(engine, label, failures)
            _check_calls(calls, cfg, label, failures)
            if wi == 0:
                cfg2, extra2 = setup(mode)
                try:
                    _, again, _ = _run_once(wl, cfg2, extra2, [])
                    if _fingerprint(again) != _fingerprint(engine):
                        failures.append(f"{label}: two runs with seed {seed} gave different results")
                except Exception as exc:
                    failures.append(f"{label}: second run: {type(exc).__name__}: {exc}")
            s = doc["summary"]
            report.runs.append({
                "workload": wl.name, "mode": mode, "requests": s["requests"], "steps": s["steps"],
                "preemptions": s["preemptions"],
            })
    report.warnings = _coverage_warnings(report, tenants is None and workload is None)
    if strict:
        failures.extend(f"{w} (strict)" for w in report.warnings)
    if failures:
        raise ConformanceError(f"{name} broke the plugin contract:\n  " + "\n  ".join(failures))
    return report


def _coverage_warnings(report: ConformanceReport, suite_tenants: bool) -> list[str]:
    """A line per hook of the plugin that was never called or never changed an answer."""
    hint = ""
    if suite_tenants:
        hint = f" on the suite's tenants ({', '.join(report.tenants)}): give tenants= or workload= to run your own"
    return [
        f"{report.plugin}: hook {cov.hook} {cov.problem}{hint}"
        for _, cov in sorted(report.coverage.items())
        if cov.problem is not None
    ]


def shipped_plugins() -> list[str]:
    """Every shipped and contrib plugin name, for `pytest.mark.parametrize`."""
    return list(SHIPPED)
