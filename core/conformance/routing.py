"""The conformance suite for `route` plugins: the router runs a small simulated cluster (several
replicas, named as the author declared them, the router's own options) on the suite's workloads;
partway through each run one replica goes down, and the router must answer a replica it was shown
(a live one). Each answer is compared with the default router's (`round_robin`) on the same
replicas: a changed answer is one that sends the request elsewhere.
"""

from __future__ import annotations

from typing import Any

from ...executors.cost_models import make_cost_model
from ...executors.simulated import SimulatedExecutor
from ..cluster.router import Router, load_router
from ..cluster.simulation import run_cluster
from ..cluster.spec import ClusterSpec
from ..cluster.view import Refuse, ReplicaView
from ..config import ConfigError, EngineConfig
from ..errors import PluginError
from ..workloads.build import Workload
from .hook_coverage import HookCoverage

DOWN_AFTER = 1 / 3
"""The share of a run's requests routed before the suite takes a replica down."""


class CheckingRouter(Router):
    """The router under test, shown only the live replicas once replica `down` is down (after
    `DOWN_AFTER` of the `total` requests); an answer naming the replica that is down, or an index
    out of the tuple it was shown, is a `PluginError` that says so."""

    def __init__(self, name: str, plugin: Any, total: int, down: int, coverage: HookCoverage) -> None:
        super().__init__([(name, plugin)])
        self.name, self.coverage = name, coverage
        self.down_at = max(1, int(total * DOWN_AFTER))
        self.down = down  # the replica (index in the cluster) that goes down
        self.default = load_router("round_robin")[1]  # by name: a shipped plugin imports metroline.api
        self.routed = 0

    def choose(self, request: Any, replicas: tuple[ReplicaView, ...]) -> int | Refuse:
        self.routed += 1
        kept = list(range(len(replicas)))
        if self.routed > self.down_at and len(replicas) > 1:
            kept = [i for i in kept if i != self.down]
        live = tuple(ReplicaView(pos, replicas[i].name, replicas[i].pool, replicas[i].policy,
                                 replicas[i]._engine, replicas[i].outstanding) for pos, i in enumerate(kept))
        self.coverage.calls += 1
        answer = self._answer(request, live)
        dead = replicas[self.down].name
        if len(live) < len(replicas) and (answer == dead or (type(answer) is int and answer >= len(live))):
            what = f"replica {answer!r}" if isinstance(answer, str) else f"index {answer} (of {len(live)})"
            raise PluginError(self.name, "route", f"answered {what} for request {request.request_id!r} while "
                              f"replica {dead!r} is down (live: {', '.join(v.name for v in live)})")
        choice = self._check(self.name, answer, live)
        default = self.default.route(request, live)
        if isinstance(choice, Refuse) or choice != default:
            self.coverage.count_change()
        return choice if isinstance(choice, Refuse) else kept[choice]

    def _answer(self, request: Any, live: tuple[ReplicaView, ...]) -> Any:
        try:
            if self._chain is None:
                return self._hook(request=request, replicas=live)
            for _, fn, argnames in self._chain:
                args = {"request": request, "replicas": live}
                answer = fn(*[args[a] for a in argnames])
                if answer is not None:
                    return answer
        except PluginError:
            raise
        except Exception as exc:
            raise PluginError(self.name, "route", f"raised {type(exc).__name__}: {exc}") from exc
        raise PluginError(self.name, "route", "no router answered")


def check_router(name: str, make_plugin: Any, spec: ClusterSpec, config: EngineConfig, workloads: list[Workload],
                 coverage: dict[str, HookCoverage], failures: list[str]) -> list[dict[str, Any]]:
    """Run the router `make_plugin()` (a fresh object per run) on a cluster of `spec` for each of
    `workloads`; returns one dict per run; appends failures. The router's options are already in
    the plugin; `spec.router_options` holds them too, so replica names in them are checked against
    the cluster's (`ClusterSpec.plan`)."""
    cov = coverage.setdefault("route", HookCoverage("route"))
    try:
        plans = spec.plan(config)
    except ConfigError as exc:  # a router option naming a replica the cluster does not have
        failures.append(f"{name}: {exc}")
        return []
    names = [p.name for p in plans]
    runs = []
    for wl in workloads:
        label = f"{name} on {wl.name} ({len(plans)} replicas: {', '.join(names)})"
        router = CheckingRouter(name, make_plugin(), len(wl.items), len(plans) // 2, cov)
        try:
            doc, engines = run_cluster(wl, config, lambda: SimulatedExecutor(make_cost_model("steps")), spec=spec,
                                       router=router)
        except Exception as exc:
            failures.append(f"{label}: {type(exc).__name__}: {exc}")
            continue
        lost = len(wl.items) - doc["summary"]["requests"]
        if lost:
            failures.append(f"{label}: {lost} requests never ended")
        runs.append({"workload": wl.name, "mode": "cluster", "requests": doc["summary"]["requests"],
                     "steps": doc["summary"]["steps"], "preemptions": doc["summary"]["preemptions"],
                     "replicas": {r["name"]: r["routed"] for r in doc["replicas"]},
                     "down": names[len(plans) // 2]})
    return runs
