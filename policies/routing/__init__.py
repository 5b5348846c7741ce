"""The shipped routers: plugins of the `route` hook (`--router NAME`, see `core/plugins/loader.py`
`ROUTERS`), one module each."""
