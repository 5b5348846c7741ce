"""Finding executors by name, like plugins: `sim`, `torch`, an entry point of the group
`metroline.executors`, or a dotted path `package.module:factory`.

A factory takes the executor's options as keyword arguments and returns an object that follows
the `Executor` protocol (`executors/base.py`). Nothing here imports an executor until it is asked for,
so the simulated path never imports torch.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from ..core.plugins.loader import import_dotted

ENTRY_POINT_GROUP = "metroline.executors"

BUILTIN: dict[str, str] = {
    "sim": "metroline.executors.registry:simulated",
    "torch": "metroline.executors.torch:from_options",
}
"""The shipped executors: name -> factory."""


def resolve_executor(spec: str) -> Any:
    """The factory `spec` names; a one-line ValueError when there is none."""
    target = BUILTIN.get(spec)
    if target is None:
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            if ep.name == spec:
                return ep.load()
        if "." not in spec and ":" not in spec:
            known = sorted(set(BUILTIN) | {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})
            raise ValueError(f"unknown executor {spec!r}; known: {', '.join(known)}; or give pkg.mod:factory")
        target = spec
    hint = " (pip install 'metroline[torch]')" if spec == "torch" else ""
    return import_dotted(target, f"executor {spec!r}", ValueError, hint)


def make_executor(spec: str, **options: Any) -> Any:
    """Build the executor `spec` names with `options` (the factory's keyword arguments)."""
    return resolve_executor(spec)(**options)


def simulated(cost_model: str = "steps", cost_params: dict | None = None, start_time: float = 0.0) -> Any:
    """The `sim` factory: a `SimulatedExecutor` on a cost model by name with its parameters
    (`step_time` only applies to the `steps` model)."""
    from .cost_models import make_cost_model
    from .simulated import SimulatedExecutor

    params = dict(cost_params or {})
    if cost_model != "steps":
        params.pop("step_time", None)
    return SimulatedExecutor(make_cost_model(cost_model, **params), start_time)
