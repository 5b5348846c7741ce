"""Conformance checks for plugin authors: run a plugin on built-in workloads and check the contract.

In a test of the plugin's package::

    from metroline.testing import check_plugin

    def test_my_plugin_conforms():
        check_plugin("mypkg.quota:TenantQuota", options={"default_max_running": 4})

`check_plugin` runs the plugin, stacked on `base` (default fcfs: "the stack without the plugin"),
on small built-in workloads with a KV pool small enough to force preemption, in each preemption
mode, and checks at every step and after the drain:

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
how many times it was called and how many of its answers differ from what the stack without it
(`base`) answers to the same question (see `metroline.core.conformance.hook_coverage`); and
`without`, for a plugin with a scheduling hook, how many requests ran differently when each
workload is run again without the plugin. A hook that was never called or never changed an
answer, and a plugin with which no request ran differently, are warnings in `report.warnings`,
and a `ConformanceError` with `strict=True`.

Every kind of hook is run where it matters:

- a `route` plugin routes the suite's workloads for a simulated cluster (`cluster=`: 3 replicas
  by default, or your pools, named as your cluster declares them), with its options; after a
  third of the requests one replica goes down, and an answer naming it (or an index outside the
  replicas the router was shown) is a failure. Answers are compared with `round_robin`'s;
- a `sample` plugin also runs the torch executor on a tiny random Llama (when torch and
  transformers are installed) with greedy and seeded sampled requests: a sampler must answer one
  token per sequence, never one a wrapper banned (`ctx.ban_tokens`), and two runs must agree.
  Its answers are compared with the samplers' below it without its masks.

A plugin that answers `num_draft_tokens` runs under speculative decoding (`SPECULATION`, unless
`config` sets `speculative_config`): the checks then also hold each step's drafts to the hook's
contract (decodes only, at most `num_speculative_tokens`, counted in the budget).

The report also lists the plugin's uses of deprecated names (`report.deprecations`): a hook or
hook argument under its old name, found when the plugin is registered, a deprecated attribute
(`ctx.hooks`) read during the runs, and every import of a moved module path in the plugin's
source, with its line. They still work, until the version each line names (see
`metroline.core.plugins.deprecations`); with `strict=True` each is a failure.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .core.config import EngineConfig
from .core.cluster.spec import ClusterSpec, cluster_spec
from .core.conformance.deprecated_imports import deprecated_imports
from .core.conformance.hook_coverage import HookCoverage
from .core.conformance.routing import check_router
from .core.conformance.runs import compare_without, run_all
from .core.conformance.sampling import check_sampler
from .core.conformance.workloads import conformance_config, conformance_workloads, own_workload, with_tenants
from .core.plugins import deprecations
from .core.plugins.loader import instantiate
from .core.plugins.manager import HOOK_NAMES, SHIPPED, resolve
from .core.workloads.build import SyntheticSpec, Workload

SPECULATION = {"num_speculative_tokens": 4, "acceptance_rate": 0.6, "acceptance_concentration": 2.0}
"""The `speculative_config` of the runs of a plugin that answers `num_draft_tokens` (unless
`config` gives one): drafts of 4 tokens, each request's acceptance drawn around 0.6."""


class ConformanceError(AssertionError):
    """A plugin broke the contract; the message lists every failure."""


@dataclass
class ConformanceReport:
    """What `check_plugin` ran and how it exercised the plugin.

    `runs`: one dict per run (workload, mode: a preemption mode, `cluster` for a router's runs,
    `sample` for the torch executor's; requests, steps, preemptions). `tenants`: the tenants the
    runs' requests had. `coverage`: hook name -> `HookCoverage` (calls and changed answers, summed
    over the runs) for every hook the plugin implements. `without`: per workload, how many
    requests ran differently on the stack without the plugin. `warnings`: one line per hook that
    was never called or never changed an answer, or a plugin that changed no request's run.
    `deprecations`: one line per deprecated name or module path the plugin used (it works until
    the version the line names).
    """

    plugin: str
    runs: list[dict[str, Any]] = field(default_factory=list)
    tenants: list[str] = field(default_factory=list)
    coverage: dict[str, HookCoverage] = field(default_factory=dict)
    without: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    deprecations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"conformance of {self.plugin}: {len(self.runs)} runs passed (tenants: {', '.join(self.tenants)})"]
        for r in self.runs:
            extra = ""
            if "replicas" in r:
                extra = f" routed={r['replicas']} (down after a third: {r['down']})"
            lines.append(f"  {r['workload']:<12} {r['mode']:<9} requests={r['requests']} steps={r['steps']} "
                         f"preemptions={r['preemptions']}{extra}")
        for w in self.without:
            lines.append(f"  {w['workload']:<12} {w['mode']:<9} {w['differ']} of {w['requests']} requests ran "
                         f"differently without the plugin (on {w['stack']})")
        lines.append("hooks of the plugin:")
        lines.extend(f"  {cov}" for _, cov in sorted(self.coverage.items()))
        lines.extend(f"note: {n}" for n in self.notes)
        lines.extend(f"warning: {w}" for w in self.warnings)
        lines.extend(f"deprecated: {d}" for d in self.deprecations)
        return "\n".join(lines)


def _is_base_policy(target: Any) -> bool:
    fn = getattr(target, "admission", None)
    if fn is None:
        return False
    opts = getattr(fn, "metroline_impl", None)
    return opts is not None and not (opts.get("wrapper") or opts.get("hookwrapper"))


def implemented_hooks(target: Any) -> set[str]:
    """The hooks `target` (a plugin class or object) implements."""
    return {h for h in HOOK_NAMES if getattr(getattr(target, h, None), "metroline_impl", None) is not None}


SCHEDULE_HOOKS = frozenset({"admission", "select_victim", "split_budget", "order_running", "estimate_output_tokens",
                            "check_request"})
"""Hooks whose answers change which request runs when: a plugin with one changes some run."""


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
    cluster: int | Mapping[str, Any] | None = None,
) -> ConformanceReport:
    """Run the conformance checks on `plugin` (a spec string, a plugin class or an instance).

    `options`: the plugin's options. `base`: the policy the plugin is stacked on (the stack
    without the plugin, which its answers and runs are compared with).
    `workloads`: replaces the suite's built-in workloads. `tenants`: your tenant names (or
    {name: share}), given to the requests of the suite's workloads (`with_tenants`). `workload`:
    your own workload, run after the suite's, with its own tenants (`own_workload`). `config`:
    `EngineConfig` overrides for the runs. `cluster` (a router): the cluster it routes for, as
    you declare it: a number of replicas (`r0`, `r1`, ...), or a `[cluster]` table's dict
    (`{"pools": {"short": {"replicas": 2}, "long": {"replicas": 1}}}`: `short-0`, ...); default 3
    replicas. `strict`: a hook of the plugin that was never called or never changed an answer, a
    plugin that changed no request's run, and a deprecated name or module path it uses are
    failures, not only lines of the report. Raises `ConformanceError` on any failure.
    """
    options = dict(options or {})
    if isinstance(plugin, str):
        spec, target = plugin, resolve(plugin)
    else:
        target = plugin
        spec = getattr(plugin, "name", None) or getattr(plugin, "__name__", None) or type(plugin).__name__
    name = getattr(target, "name", None) or spec
    is_policy = _is_base_policy(target)
    hooks = implemented_hooks(target)

    def setup(mode: str, with_plugin: bool = True) -> tuple[EngineConfig, list[Any]]:
        fields = dict(config or {}, preemption_mode=mode, seed=seed)
        if hasattr(target, "num_draft_tokens") and "speculative_config" not in fields:
            fields["speculative_config"] = SPECULATION  # its hook runs only under speculation
        if not with_plugin:
            return conformance_config(policy=base, **fields), []
        if isinstance(plugin, str):
            fields["plugin_options"] = {name: options}
            if is_policy and spec == base:
                return conformance_config(policy=spec, **fields), []
            return conformance_config(policy=base, plugins=[spec], **fields), []
        fields["policy"] = base
        return conformance_config(**fields), [make_plugin()]

    def make_plugin() -> Any:
        return instantiate(spec, target, options)[1] if inspect.isclass(target) else target

    report = ConformanceReport(name)
    failures: list[str] = []
    workload_list = list(workloads) if workloads is not None else conformance_workloads(seed)
    if tenants is not None:
        workload_list = [with_tenants(w, tenants, seed) for w in workload_list]
    if workload is not None:
        workload_list.append(own_workload(workload))
    report.tenants = sorted({it.tenant for w in workload_list for it in w.items})
    modes = tuple(modes)
    with deprecations.recording() as uses:
        if hooks - {"route"} or not hooks:
            fingerprints = run_all(report, workload_list, modes, name, setup, seed, failures)
            if hooks & SCHEDULE_HOOKS and not (is_policy and spec == base):
                compare_without(report, workload_list, modes[0], setup, fingerprints, base, failures)
        if "route" in hooks:
            report.runs += check_router(name, make_plugin, _cluster_of(cluster, spec, options), setup(modes[0], False)[0],
                                        workload_list, report.coverage, failures)
        if "sample" in hooks:
            run = check_sampler(name, lambda: setup(modes[0]), seed, report.coverage, failures)
            if run is None:
                report.notes.append("sample: not run on real logits (torch and transformers are not installed)")
            else:
                report.runs.append(run)
    report.deprecations = _deprecated_uses(uses, name) + deprecated_imports(target)
    report.warnings = _coverage_warnings(report, tenants is None and workload is None)
    if report.without and not any(w["differ"] for w in report.without):
        report.warnings.append(f"{name}: no request ran differently without the plugin, on any workload")
    if strict:
        failures.extend(f"{w} (strict)" for w in report.warnings)
        failures.extend(f"deprecated: {d} (strict)" for d in report.deprecations)
    if failures:
        if not strict:
            failures.extend(f"(not a failure) deprecated: {d}" for d in report.deprecations)
        raise ConformanceError(f"{name} broke the plugin contract:\n  " + "\n  ".join(failures))
    return report


def _cluster_of(cluster: int | Mapping[str, Any] | None, spec: str, options: dict[str, Any]) -> ClusterSpec:
    """The cluster a router is checked on (see `check_plugin`'s `cluster`)."""
    if cluster is None or isinstance(cluster, int):
        return cluster_spec(None, replicas=cluster or 3, router=spec, router_options=options)
    return cluster_spec({**cluster, "router": spec, "router_options": options}, source="cluster")


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
