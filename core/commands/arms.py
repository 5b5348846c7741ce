"""The arms a `compare` or `sweep` runs: one config per `--policies` label (`a+b` stacks plugin b
on policy a) and one cluster spec per `--routers` label."""

from __future__ import annotations

from typing import Any


def _own_options(configs: list[Any]) -> list[Any]:
    """Give each compared run the plugin options of the plugins it loads (a config file may hold
    options for a plugin only some runs stack); an option table no run loads is an error."""
    from ..plugins.manager import plugin_name, resolve

    loaded = []
    for c in configs:
        names = set()
        for spec in [c.policy, *c.plugins]:
            names.add(spec)
            try:
                names.add(plugin_name(resolve(spec), spec))
            except Exception:  # noqa: BLE001 - a bad spec is reported by its run, with the policy named
                pass
        loaded.append(names)
    stray = sorted(set(configs[0].plugin_options) - set().union(*loaded))
    if stray:
        raise ValueError(f"plugin_options.{stray[0]}: no compared run loads plugin {stray[0]!r}")
    return [c.model_copy(update={"plugin_options": {k: v for k, v in c.plugin_options.items() if k in names}})
            for c, names in zip(configs, loaded)]


def policy_configs(policies: str, config: Any) -> tuple[list[str], list[Any]]:
    """The labels of `--policies` (`a+b` stacks plugin b on policy a) and a config for each, with
    the plugin options of the plugins it loads."""
    labels = [p.strip() for p in policies.split(",") if p.strip()]
    if not labels:
        raise ValueError("--policies: give at least one policy")
    configs = []
    for label in labels:
        policy, *stacked = label.split("+")
        configs.append(config.model_copy(update={"policy": policy, "plugins": [*stacked, *config.plugins]}))
    return labels, _own_options(configs)


def router_specs(routers: str, spec: Any) -> tuple[list[str], list[Any]]:
    """The labels of `--routers` (`name` or `name:key=value:key=value`, options for that router)
    and the cluster spec of each: `spec` with that router (and its options; the `[cluster]`
    table's and `--router-option`'s apply to the router they were given for)."""
    from ..cluster.spec import parse_router_options

    labels, specs = [], []
    for item in (r.strip() for r in routers.split(",")):
        if not item:
            continue
        name, *opts = item.split(":")
        options = parse_router_options(opts)
        if name == spec.router:
            options = {**spec.router_options, **options}
        labels.append(item)
        specs.append(spec.model_copy(update={"router": name, "router_options": options}))
    if not labels:
        raise ValueError("--routers: give at least one router")
    return labels, specs
