"""The import paths of modules that moved in 0.2.0, kept working.

`core/` was 80 modules side by side; 0.2.0 put them in subpackages by concept (`step/`,
`requests/`, `plugins/`, `workloads/`, `experiments/`, `results/`, `conformance/`) and moved the
torch sampler to `executors/torch/sampling.py`. A plugin that imports an old path
(`from metroline.core.hookspecs import hookimpl`) still gets the very same module, with one
`MetrolineDeprecationWarning` naming the new path and the version that removes the old one
(`deprecations.MODULES_REMOVED_IN`, 0.3.0: this module and its finder go then; prefer
`metroline.api`). `install()` (run when
`metroline.core` is imported) adds the finder that does it; `OLD_PATHS` lists every moved module.
The two old modules whose names are now packages (`metroline.core.plugins`,
`metroline.core.workloads`) answer their old attributes through the package's `__getattr__`
(`deprecations.moved_attribute`).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from typing import Any

OLD_PATHS = {
    "admission": "core.step.admission",
    "answers": "core.plugins.answers",
    "api_surface": "core.plugins.api_surface",
    "async_engine": "core.step.async_engine",
    "budget": "core.plugins.budget",
    "candidates": "core.plugins.candidates",
    "conformance_checks": "core.conformance.checks",
    "conformance_workloads": "core.conformance.workloads",
    "context": "core.step.context",
    "defaults": "core.plugins.defaults",
    "deprecations": "core.plugins.deprecations",
    "detokenizer": "core.requests.detokenizer",
    "engine": "core.step.engine",
    "fairness": "core.results.fairness",
    "forking": "core.step.forking",
    "hook_coverage": "core.conformance.hook_coverage",
    "hook_relay": "core.plugins.hook_relay",
    "hookspecs": "core.plugins.hookspecs",
    "horizon": "core.results.horizon",
    "inflight": "core.plugins.inflight",
    "intake": "core.step.intake",
    "lazy_heap": "core.plugins.lazy_heap",
    "lifecycle_log": "core.step.lifecycle_log",
    "load_check": "core.experiments.load_check",
    "logprobs": "core.requests.logprobs",
    "manifest": "core.experiments.manifest",
    "metrics": "core.results.metrics",
    "metrics_collector": "core.results.collector",
    "outputs": "core.step.outputs",
    "paired": "core.results.paired",
    "parallel": "core.experiments.parallel",
    "plan": "core.step.plan",
    "plugin_loader": "core.plugins.loader",
    "plugin_options": "core.plugins.options",
    "preemption": "core.plugins.preemption",
    "progress": "core.results.progress",
    "queue_order": "core.plugins.queue_order",
    "ray_runner": "core.experiments.ray_runner",
    "recovery": "core.step.recovery",
    "replay_check": "core.experiments.replay_check",
    "report": "core.results.report",
    "report_numbers": "core.results.report_numbers",
    "request": "core.requests.request",
    "resample": "core.workloads.resample",
    "rescue": "core.step.rescue",
    "result_document": "core.results.document",
    "result_files": "core.results.files",
    "run_series": "core.experiments.run_series",
    "runner": "core.experiments.runner",
    "sampling": "core.requests.sampling",
    "sampling_torch": "executors.torch.sampling",
    "scheduler": "core.step.scheduler",
    "sequence": "core.requests.sequence",
    "plugins.shares": "core.step.reserves",
    "shares": "core.step.reserves",
    "slo": "core.experiments.slo",
    "stall": "core.step.stall",
    "stats": "core.results.stats",
    "step_prefix": "core.step.step_prefix",
    "summaries": "core.results.summaries",
    "sweep": "core.experiments.sweep",
    "text_requests": "core.workloads.text_requests",
    "token_streams": "core.workloads.token_streams",
    "traces": "core.workloads.traces",
    "victim_loop": "core.step.victim_loop",
    "victims": "core.plugins.victims",
    "workload_generators": "core.workloads.generators",
    "workload_items": "core.workloads.items",
    "workload_specs": "core.workloads.specs",
}
"""Moved modules: old name under `metroline.core` -> new name under `metroline`."""


def _warn(old: str, new: str, stacklevel: int) -> None:
    from .plugins.deprecations import warn_moved

    warn_moved(old, new, stacklevel=stacklevel + 1)


class _Alias(importlib.abc.Loader):
    def __init__(self, module: Any) -> None:
        self.module = module

    def create_module(self, spec: Any) -> Any:
        return self.module

    def exec_module(self, module: Any) -> None:
        pass


class _OldPathFinder(importlib.abc.MetaPathFinder):
    """Answers an old module path with the module at its new path."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if not fullname.startswith("metroline.core."):
            return None
        new = OLD_PATHS.get(fullname[len("metroline.core."):])
        if new is None:
            return None
        _warn(fullname, f"metroline.{new}", stacklevel=_importer_level())
        module = importlib.import_module(f"metroline.{new}")
        return importlib.util.spec_from_loader(fullname, _Alias(module))


def _importer_level() -> int:
    """The `stacklevel`, counted from `find_spec` (1), of the code that imports the old path: the
    first frame above it outside importlib, so that the warning names the plugin's own import
    line, not `importlib/__init__.py` (an entry point's `import_module`). `warnings` itself does
    not count importlib's frozen `_bootstrap` frames, so neither does this."""
    frame, level = sys._getframe(2), 2  # 1 is find_spec, 2 its caller
    while frame is not None:
        name = frame.f_code.co_filename
        bootstrap = "importlib" in name and "_bootstrap" in name
        if not bootstrap and not name.startswith(_IMPORTLIB_DIR):
            break
        level += not bootstrap
        frame = frame.f_back
    return level


_IMPORTLIB_DIR = importlib.__file__.rsplit("__init__.py", 1)[0]


def install() -> None:
    """Add the finder of old paths to `sys.meta_path` (once)."""
    if not any(isinstance(f, _OldPathFinder) for f in sys.meta_path):
        sys.meta_path.append(_OldPathFinder())
