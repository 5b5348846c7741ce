"""metroline: a continuous-batching LLM inference scheduler whose policy is made of pluggy plugins.

The main entry points::

    from metroline import Engine, EngineConfig, Request, SamplingParams, hookimpl
"""

from .core.config import EngineConfig
from .core.plugins.hookspecs import hookimpl
from .core.requests.request import Request, SamplingParams
from .core.step.engine import Engine, RequestOutput

__version__ = "0.2.0"

__all__ = ["Engine", "EngineConfig", "Request", "RequestOutput", "SamplingParams", "hookimpl"]
