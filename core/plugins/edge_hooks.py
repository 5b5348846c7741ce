"""The hooks outside the step, once per request: `check_request` (could this request ever run?)
and `route` (which replica of a cluster serves it). Their contract, shared by every hook, is
`metroline.core.plugins.hookspecs`'s docstring."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .markers import hookspec

if TYPE_CHECKING:
    from ..cluster.view import Refuse, ReplicaView, RouteRequest
    from ..requests.sequence import Sequence
    from ..step.context import StepContext


# --- at the edge: once per request, outside the step ------------------------------------------


@hookspec(firstresult=True)
def check_request(ctx: StepContext, seq: Sequence) -> str | None:
    """Why `seq` (a new request's `Sequence`, not yet waiting) could never run under this
    plugin's limits (a tenant's running cap below the request's `sampling.n`, ...), or None.

    Returns:
        A one-line reason: the request is refused (`RequestRefused`; `rejected` in a replay)
        instead of waiting for ever. Anything else than a string or None is a `PluginError`.

    Called by `Engine.add_request`, once per request, through the same relay as every hook:
    plugins newest first until one gives a reason (firstresult), which is reported prefixed with
    the name of the plugin that gave it. A `wrapper=True` implementation sees the reason of the
    ones below it (`reason = yield`) and may return another (a refusal of its own, or None to let
    the request in); a reason a wrapper gives is prefixed with the wrapper's name.
    """


# --- the cluster: once per request, before any replica sees it ---------------------------------


@hookspec(firstresult=True)
def route(request: RouteRequest, replicas: tuple[ReplicaView, ...]) -> int | str | Refuse | None:
    """Which replica of a cluster serves `request` (`metroline.core.cluster`).

    Args:
        request: the arriving request (`RouteRequest`: `request_id`, `arrival_s`,
            `prompt_token_ids`, `prompt_len`, `max_new_tokens`, `tenant`, `priority`).
        replicas: a read-only view of each replica the request may go to (`ReplicaView`): every
            live replica, except that in a pool with a canary only the replicas of the
            request's arm (`metroline.core.cluster.targets`); `index` is the view's place in this tuple.
            Each has `name`, `pool`, `policy`, `num_waiting`, `num_running`, `kv_used_blocks`,
            `kv_free_blocks`, `outstanding_requests`, `outstanding_tokens` (prompt plus
            `max_new_tokens` of the requests routed there that have not ended) and
            `prefix_hit(request)`, the prompt tokens its prefix cache would serve (computed when
            asked). The views read the replicas' live state: keep none across calls.

    Returns:
        A replica index (an int in `[0, len(replicas))`), a replica name, or `Refuse(reason)`: the
        request is refused (`rejected` in a replay, with the reason prefixed by the plugin's name).
        Anything else (an index out of range, an unknown name, a bool, a float) is a `PluginError`
        naming the plugin and the hook `route`, as is an exception the plugin raises.

    Called by the cluster, once per request, at its arrival (on the cluster's virtual clock in
    simulation), before any replica sees it; never inside a step. Its plugins are the cluster's
    router (`--router NAME`), not a replica's policy stack. The shipped routers
    (`metroline.core.plugins.loader.ROUTERS`): `round_robin` (the default), `least_outstanding_tokens`,
    `power_of_two`, `prefix_aware` and `length_pools`.
    """
