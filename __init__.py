"""metroline: a continuous-batching LLM inference scheduler whose policy is made of pluggy plugins."""

__version__ = "0.1.0"
