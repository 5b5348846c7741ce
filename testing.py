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
`metroline.core.conformance.hook_coverage`); a hook that was never called, or never changed an answer, is a
warning in `report.warnings`, and a `ConformanceError` with `strict=True`.

A plugin that answers `num_draft_tokens` runs under speculative decoding (`SPECULATION`, unless
`config` sets `speculative_config`): the checks then also hold each step's drafts to the hook's
contract (decodes only, at most `num_speculative_tokens`, counted in the budget).

The report also lists the plugin's uses of deprecated names (`report.deprecations`): a hook or
hook argument under its old name, found when the plugin is registered, and a deprecated
attribute (`ctx.hooks`) read during the runs. They still work, until the version each line names
(see `metroline.core.plugins.deprecations`).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .core.config import EngineConfig
from .core.conformance.checks import (
    PER_STEP_LIMITS,
    check_calls,
    check_drained,
    fingerprint,
    run_once,
)
from .core.conformance.hook_coverage import HookCoverage
from .core.conformance.workloads import conformance_config, conformance_workloads, own_workload, with_tenants
from .core.plugins import deprecations
from .core.plugins.loader import instantiate
from .core.plugins.manager import SHIPPED, resolve
from .core.workloads.build import SyntheticSpec, Workload

SPECULATION = {"num_speculative_tokens": 4, "acceptance_rate": 0.6, "acceptance_concentration": 2.0}
"""The `speculative_config` of the runs of a plugin that answers `num_draft_tokens` (unless
`config` gives one): drafts of 4 tokens, each request's acceptance drawn around 0.6."""


class ConformanceError(AssertionError):
    """A plugin broke the contract; the message lists every failure."""


@dataclass
class ConformanceReport:
    """What `check_plugin` ran and how it exercised the plugin.

    `runs`: one dict per run (workload, preemption mode, requests, steps, preemptions).
    `tenants`: the tenants the runs' requests had. `coverage`: hook name -> `HookCoverage` (calls
    and changed answers, summed over the runs) for every hook the plugin implements. `warnings`:
    one line per hook that was never called or never changed an answer. `deprecations`: one line
    per deprecated name the plugin used (it works until the version the line names).
    """

    plugin: str
    runs: list[dict[str, Any]] = field(default_factory=list)
    tenants: list[str] = field(default_factory=list)
    coverage: dict[str, HookCoverage] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    deprecations: list[str] = field(default_factory=list)

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
        lines.extend(f"deprecated: {d}" for d in self.deprecations)
        return "\n".join(lines)


def _is_base_policy(target: Any) -> bool:
    fn = getattr(target, "admission", None)
    if fn is None:
        return False
    opts = getattr(fn, "metroline_impl", None)
    return opts is not None and not (opts.get("wrapper") or opts.get("hookwrapper"))


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
        if hasattr(target, "num_draft_tokens") and "speculative_config" not in fields:
            fields["speculative_config"] = SPECULATION  # its hook runs only under speculation
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
    with deprecations.recording() as uses:
        _run_all(report, workload_list, modes, name, setup, seed, failures)
    report.deprecations = _deprecated_uses(uses, name)
    report.warnings = _coverage_warnings(report, tenants is None and workload is None)
    if strict:
        failures.extend(f"{w} (strict)" for w in report.warnings)
    if failures:
        failures.extend(f"(not a failure) deprecated: {d}" for d in report.deprecations)
        raise ConformanceError(f"{name} broke the plugin contract:\n  " + "\n  ".join(failures))
    return report


def _run_all(
    report: ConformanceReport, workload_list: list[Workload], modes: Iterable[str], name: str, setup: Any,
    seed: int, failures: list[str],
) -> None:
    """Each workload in each mode (the first workload twice: the results must be identical)."""
    modes = tuple(modes)
    for wi, wl in enumerate(workload_list):
        for mode in modes:
            label = f"{name} on {wl.name} ({mode})"
            cfg, extra = setup(mode)
            try:
                doc, engine, calls = run_once(wl, cfg, extra, failures, report.coverage)
            except Exception as exc:  # a PluginError, a stuck engine, a crash: all are failures
                failures.append(f"{label}: {type(exc).__name__}: {exc}")
                continue
            check_drained(engine, label, failures)
            check_calls(calls, cfg, label, failures)
            if wi == 0:
                cfg2, extra2 = setup(mode)
                try:
                    _, again, _ = run_once(wl, cfg2, extra2, [])
                    if fingerprint(again) != fingerprint(engine):
                        failures.append(f"{label}: two runs with seed {seed} gave different results")
                except Exception as exc:
                    failures.append(f"{label}: second run: {type(exc).__name__}: {exc}")
            s = doc["summary"]
            report.runs.append({
                "workload": wl.name, "mode": mode, "requests": s["requests"], "steps": s["steps"],
                "preemptions": s["preemptions"],
            })


def _deprecated_uses(uses: list[deprecations.Use], name: str) -> list[str]:
    """One line per deprecated name the plugin `name` used (or code no loaded plugin owns), in
    the order first used."""
    lines = [str(u) for u in uses if u.plugin == name or u.plugin.startswith("<")]
    return list(dict.fromkeys(lines))


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
