"""Workloads: what a run replays, built from specs, generators and real traces.

- `build.py`: `build_workload` and scaling (and the names below, re-exported);
- `items.py`: `WorkloadItem`, `Workload`, limits; `token_streams.py`: prompt tokens of segments;
- `specs.py`: `SyntheticSpec`, length distributions, spec files; `generators.py`: the built-ins;
- `traces.py`: Azure CSV and Mooncake JSONL readers; `resample.py`: new draws of a trace per seed;
- `text_requests.py`: request files with text, and the outputs file.

`metroline.core.workloads.build_workload` (the module `metroline.core.workloads` before 0.2.0)
still resolves, with a deprecation warning naming `metroline.core.workloads.build`.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any


def __getattr__(name: str) -> Any:
    if name.startswith("__") or name in {m.name for m in pkgutil.iter_modules(__path__)}:
        raise AttributeError(name)  # a submodule not imported yet: the import system's question
    from ..plugins.deprecations import moved_attribute

    return moved_attribute("metroline.core.workloads", importlib.import_module(f"{__name__}.build"), name)
