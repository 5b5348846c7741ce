"""A cluster's router: the plugins of the `route` hook, called once per arriving request."""

from __future__ import annotations

import difflib
from typing import Any

import pluggy

from ..errors import PluginError, PluginLoadError
from ..plugins import hookspecs
from ..plugins.loader import ROUTERS, import_dotted, instantiate, plugin_name, resolve
from .view import Refuse, ReplicaView, RouteRequest

DEFAULT_ROUTER = "round_robin"


def load_router(spec: str, options: dict[str, Any] | None = None) -> tuple[str, Any]:
    """(name, plugin) of a router spec: a shipped router's name (`ROUTERS`), or any plugin spec
    (an entry point, a dotted path) whose plugin implements `route`."""
    if spec in ROUTERS:
        target = import_dotted(ROUTERS[spec], f"router {spec!r}")
    else:
        try:
            target = resolve(spec)
        except PluginLoadError as exc:
            if "unknown plugin" not in str(exc):
                raise
            close = difflib.get_close_matches(spec, sorted(ROUTERS), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise PluginLoadError(
                f"unknown router {spec!r}{hint} (shipped: {', '.join(ROUTERS)}; or an entry point or pkg.mod:Obj)"
            ) from None
    name, plugin = instantiate(spec, target, dict(options or {}))
    if not callable(getattr(plugin, "route", None)):
        raise PluginLoadError(f"router {spec!r}: plugin {name!r} does not implement the hook 'route'")
    return name, plugin


class Router:
    """The `route` hook over the given router plugins (the last one answers first), with each
    answer checked against the replicas: `choose(request, replicas)` is a replica index or a
    `Refuse`. A bad answer, or an exception, is a `PluginError` naming the plugin and `route`."""

    def __init__(self, plugins: list[tuple[str, Any]]) -> None:
        pm = pluggy.PluginManager(hookspecs.PROJECT)
        pm.add_hookspecs(hookspecs)
        for name, plugin in plugins:
            try:
                pm.register(plugin, name=name)
                pm.check_pending()
            except (pluggy.PluginValidationError, ValueError) as exc:
                raise PluginLoadError(f"router {name!r}: {exc}") from exc
        impls = pm.hook.route.get_hookimpls()
        self._only: tuple[str, Any] | None = None  # (name, function) of a lone plain router
        if any(i.wrapper or i.hookwrapper for i in impls):
            self._chain = None  # through pluggy (wrappers); errors are named by the last plugin
            self._hook = pm.hook.route
        else:
            self._chain = [(i.plugin_name, i.function, tuple(i.argnames)) for i in reversed(impls)]
            if len(self._chain) == 1 and self._chain[0][2] == ("request", "replicas"):
                self._only = self._chain[0][:2]
        self.names = [n for n, _ in plugins]

    def choose(self, request: RouteRequest, replicas: tuple[ReplicaView, ...]) -> int | Refuse:
        """The index of the replica that serves `request`, or the router's `Refuse`."""
        only = self._only
        if only is not None:  # the usual case, once per request: one router, its answer an index
            try:
                answer = only[1](request, replicas)
            except Exception as exc:
                raise PluginError(only[0], "route", f"raised {type(exc).__name__}: {exc}") from exc
            if type(answer) is int and 0 <= answer < len(replicas):
                return answer
            if answer is None:
                raise PluginError(only[0], "route", "no router answered")
            return self._check(only[0], answer, replicas)
        if self._chain is None:
            name = self.names[-1]
            try:
                return self._check(name, self._hook(request=request, replicas=replicas), replicas)
            except PluginError:
                raise
            except Exception as exc:
                raise PluginError(name, "route", f"raised {type(exc).__name__}: {exc}") from exc
        for name, fn, argnames in self._chain:
            try:
                if argnames == ("request", "replicas"):
                    answer = fn(request, replicas)
                else:
                    args = {"request": request, "replicas": replicas}
                    answer = fn(*[args[a] for a in argnames])
            except Exception as exc:
                raise PluginError(name, "route", f"raised {type(exc).__name__}: {exc}") from exc
            if answer is not None:
                return self._check(name, answer, replicas)
        raise PluginError(self.names[-1] if self.names else "?", "route", "no router answered")

    @staticmethod
    def _check(name: str, answer: Any, replicas: tuple[ReplicaView, ...]) -> int | Refuse:
        if type(answer) is int:
            if 0 <= answer < len(replicas):
                return answer
            raise PluginError(name, "route", f"replica index {answer} out of range (0..{len(replicas) - 1})")
        if isinstance(answer, str):
            for r in replicas:
                if r.name == answer:
                    return r.index
            raise PluginError(name, "route", f"no replica named {answer!r} ({', '.join(r.name for r in replicas)})")
        if isinstance(answer, Refuse):
            if not isinstance(answer.reason, str) or not answer.reason.strip():
                raise PluginError(name, "route", f"a Refuse needs a reason (a non-empty string), got {answer.reason!r:.80}")
            return answer
        raise PluginError(
            name, "route", f"expected a replica index (int), a replica name or Refuse(reason), got {answer!r:.80}"
        )


def make_router(spec: str = DEFAULT_ROUTER, options: dict[str, Any] | None = None) -> Router:
    """The `Router` of one router spec with its options."""
    return Router([load_router(spec, options)])


__all__ = ["DEFAULT_ROUTER", "Router", "load_router", "make_router", "plugin_name"]
