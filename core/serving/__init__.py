"""The OpenAI-compatible HTTP server (`metroline serve`): app, wire format, tenants, metrics."""
