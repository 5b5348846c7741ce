"""The real executor: a Hugging Face causal LM on metroline's paged, prefix-shared KV."""

from .executor import TorchExecutor, from_options

__all__ = ["TorchExecutor", "from_options"]
