"""Errors the engine raises on behalf of plugins."""

from __future__ import annotations


class PluginError(RuntimeError):
    """A plugin raised, or gave an invalid answer to, a hook. Names the plugin and the hook, and
    the request when the error is that one request's (`request_id`: a hook called for it alone,
    `on_arrival` or `estimate_output_tokens`, or its own row of a `sample` answer).

    An error with a `request_id` fails that request only: the step goes on for the others and
    `Engine.step` raises the error once the step is done. `outputs`: set by `Engine.step` on the
    error it raises, the step's outputs (those of the requests it failed included), so that a
    caller that serves on (the server's loop) loses none of them."""

    def __init__(self, plugin: str, hook: str, problem: str, request_id: str | None = None) -> None:
        self.plugin = plugin
        self.hook = hook
        self.problem = problem
        self.request_id = request_id
        self.outputs: list | None = None
        super().__init__(self._message())

    def _message(self) -> str:
        request = f", request {self.request_id!r}" if self.request_id is not None else ""
        return f"plugin {self.plugin!r}, hook {self.hook!r}{request}: {self.problem}"

    def for_request(self, request_id: str) -> PluginError:
        """This error, attributed to `request_id` (unless it already names a request)."""
        if self.request_id is None:
            self.request_id = request_id
            self.args = (self._message(),)
        return self


class PluginLoadError(ValueError):
    """A plugin could not be found, imported or configured."""


class NoProgressError(RuntimeError):
    """The engine has requests but its plugins schedule nothing, and nothing will change that (no
    arrival is pending and no plugin asked to be woken up later)."""


class RequestRefused(ValueError):
    """A request that could never run under the engine's plugins (see the `check_request` hook);
    it is refused at `Engine.add_request`, as an invalid request is."""
