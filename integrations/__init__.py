"""metroline's policies inside other serving engines (`metroline.integrations.vllm`: vLLM's
scheduler). Nothing here is imported by metroline's own engine."""
