"""metroline's plugin stack as vLLM's scheduler: `--scheduler-cls
metroline.integrations.vllm.MetrolineScheduler` (or `MetrolineAsyncScheduler` where vLLM
schedules asynchronously, as on GPUs).

vLLM keeps its KV blocks, prefix caching, speculative slots and output records; metroline's hooks
decide who is admitted and in which order, the order of the running, the preemption victim, the
step's token budget and chunk cap, and hear every event (see `support` for what maps how, and
docs/guide/vllm.md). The policy stack comes from `--additional-config '{"metroline": {...}}'`
(`settings`). Importing this package does not import vLLM; the scheduler classes do.
"""

from __future__ import annotations

from typing import Any

from .settings import BridgeSettings, settings_from_additional_config
from .versions import SUPPORTED_VLLM, check_vllm_version

__all__ = [
    "BridgeSettings", "MetrolineAsyncScheduler", "MetrolineScheduler", "SUPPORTED_VLLM", "check_vllm_version",
    "settings_from_additional_config",
]


def __getattr__(name: str) -> Any:
    if name in ("MetrolineScheduler", "MetrolineAsyncScheduler"):
        from . import scheduler

        return getattr(scheduler, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
