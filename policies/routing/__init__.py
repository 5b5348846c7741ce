"""The shipped routers: plugins of the `route` hook (`--router NAME`, see
`metroline.core.plugins.loader.ROUTERS`), one module each."""
