"""metroline's plugin API: every name a plugin author may use, in one module, kept from release to
release.

A plugin imports from here (``from metroline.api import Candidates, hookimpl``) or from the
module each name is documented in (``metroline.core.plugins.candidates``); both keep working. What this
module lists is a contract:

- the names below (`__all__`), with their signatures, fields, methods and attributes;
- every hook of `metroline.core.plugins.hookspecs`, with its argument names and whether it is
  `firstresult`;
- the shipped plugins' names and their options (`[plugin_options.NAME]`).

`docs/api_surface.txt` is a snapshot of that surface, one line per name (`surface_lines`); a test
fails when the code's surface differs from it, and when a name that differs from the last
release's (`docs/api_surface.released.txt`) is not in CHANGELOG.md's Unreleased section. A name
is never removed outright: it is deprecated first (`metroline.core.plugins.deprecations`) and keeps working,
with a `MetrolineDeprecationWarning`, for at least one minor version.

After changing the surface on purpose, write the snapshot again and say what changed in
CHANGELOG.md::

    python -m metroline.api --write-snapshot   # rewrites docs/api_surface.txt
    python -m metroline.api --check            # the snapshot and the changelog, as the tests check

The engine's embedding API (`Engine`, `EngineConfig`, the commands) is not part of this contract.
"""

from __future__ import annotations

from .core.cluster.prefix_directory import PrefixDirectory
from .core.cluster.view import Refuse, ReplicaView, RouteRequest
from .core.experiments.arms import Arm, compare_arms
from .core.errors import NoProgressError, PluginError, PluginLoadError, RequestRefused
from .core.plugins.budget import Split
from .core.plugins.candidates import Candidates, close_candidates
from .core.plugins.deprecations import MetrolineDeprecationWarning
from .core.plugins.hookspecs import hookimpl
from .core.plugins.inflight import PromptsInFlight, missing_blocks
from .core.plugins.lazy_heap import ArrivalQueue, LazyHeap, arrival_key
from .core.plugins.loader import ENTRY_POINT_GROUP, HOOK_NAMES, SHIPPED
from .core.plugins.options import PluginOptions, PluginOptionsError, options_model, take_options
from .core.plugins.answers import shares_problem
from .core.plugins.preemption import RECOMPUTE, SWAP, Preempt, is_protected
from .core.plugins.queue_order import queued_in_order
from .core.plugins.victims import last_admitted, last_admitted_victim
from .core.requests.request import Request, SamplingParams, StructuredOutput
from .core.requests.sequence import FINISHED, QUEUED, RUNNING, SWAPPED, WAITING, FinishReason, SeqState, Sequence
from .core.step.context import StepContext
from .core.step.plan import StepPlan
from .core.workloads.generators import generate
from .core.workloads.items import Workload, WorkloadItem
from .core.workloads.specs import FixedLength, LognormalLength, SyntheticSpec, TenantSpec, UniformLength, load_spec
from .executors.cost_models import CostModel, make_cost_model
from .testing import ConformanceError, ConformanceReport, check_plugin

__all__ = [
    # hooks: implement them with @hookimpl (their names: HOOK_NAMES; specs: metroline.core.plugins.hookspecs)
    "hookimpl", "HOOK_NAMES",
    # what hooks see
    "StepContext", "Sequence", "SeqState", "FinishReason", "WAITING", "RUNNING", "SWAPPED", "FINISHED", "QUEUED",
    "StepPlan",
    # what hooks answer
    "Candidates", "close_candidates", "Split", "shares_problem", "Preempt", "RECOMPUTE", "SWAP", "is_protected",
    # what the route hook sees and answers (a cluster's router)
    "RouteRequest", "ReplicaView", "Refuse", "PrefixDirectory",
    # helpers for policies
    "LazyHeap", "ArrivalQueue", "arrival_key", "queued_in_order", "last_admitted", "last_admitted_victim",
    "PromptsInFlight", "missing_blocks",
    # requests
    "Request", "SamplingParams", "StructuredOutput",
    # workloads for trying a plugin
    "SyntheticSpec", "TenantSpec", "FixedLength", "UniformLength", "LognormalLength", "load_spec", "generate",
    "Workload", "WorkloadItem",
    # loading plugins, their options, errors and warnings
    "ENTRY_POINT_GROUP", "SHIPPED", "PluginOptions", "PluginOptionsError", "take_options", "options_model",
    "PluginError", "PluginLoadError", "NoProgressError", "RequestRefused", "MetrolineDeprecationWarning",
    # the conformance suite
    "check_plugin", "ConformanceError", "ConformanceReport",
    # comparing arms that differ in policy stack, engine config and cost model, on the same draws
    "Arm", "compare_arms",
    # pricing a step's work (the simulator's cost models), for plugins that weigh work by its cost
    "CostModel", "make_cost_model",
]


if __name__ == "__main__":  # `python -m metroline.api [--write-snapshot|--check]`: the surface's own command
    import runpy

    runpy.run_module("metroline.core.plugins.api_surface", run_name="__main__", alter_sys=True)
