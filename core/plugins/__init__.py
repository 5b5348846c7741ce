"""The plugin machinery: the hook specification, the plugin manager, and what hooks answer with.

- `hookspecs.py`: every hook, its arguments, answers and the core's checks (`hookimpl`);
- `manager.py`: `PluginManager` (the defaults, the base policy, the stacked plugins);
- `loader.py`: plugins by shipped name, entry point or dotted path; `options.py`: their options;
- `hook_relay.py` (calling hooks, errors naming the plugin), `answers.py` (checks of answers),
  `defaults.py` (the defaults registered first), `deprecations.py` (old names kept working),
  `api_surface.py` (the snapshot of the plugin API);
- what plugins answer and build with: `candidates.py` (`Candidates`), `budget.py` (`Split`; how
  the step honours its `shares`: `metroline.core.step.reserves`), `preemption.py` (`Preempt`),
  `lazy_heap.py`, `queue_order.py`, `victims.py`, `inflight.py`.

`metroline.core.plugins.PluginManager` (the module `metroline.core.plugins` before 0.2.0) still
resolves, with a deprecation warning naming `metroline.core.plugins.manager`.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any


def __getattr__(name: str) -> Any:
    if name.startswith("__") or name in {m.name for m in pkgutil.iter_modules(__path__)}:
        raise AttributeError(name)  # a submodule not imported yet: the import system's question
    from .deprecations import moved_attribute

    return moved_attribute("metroline.core.plugins", importlib.import_module(f"{__name__}.manager"), name)
