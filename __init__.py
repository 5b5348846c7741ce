"""metroline: a continuous-batching LLM inference scheduler whose policy is made of pluggy plugins.

The main entry points::

    from metroline import Engine, EngineConfig, Request, SamplingParams, hookimpl
"""

from .core.config import EngineConfig
from .core.engine import Engine, RequestOutput
from .core.hookspecs import hookimpl
from .core.request import Request, SamplingParams

__version__ = "0.1.0"

__all__ = ["Engine", "EngineConfig", "Request", "RequestOutput", "SamplingParams", "hookimpl"]
