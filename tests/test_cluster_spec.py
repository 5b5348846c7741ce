"""The cluster's make-up (`core/cluster/spec.py`, the `[cluster]` table) and the canary split
(`core/cluster/targets.py`); runs of such clusters through `metroline run` and `compare`."""

from __future__ import annotations

import json

import pytest

from metroline import cli
from metroline.core.cluster.simulation import run_cluster
from metroline.core.cluster.spec import ClusterSpec, cluster_spec
from metroline.core.cluster.targets import RouteTargets
from metroline.core.cluster.view import ReplicaView, RouteRequest
from metroline.core.config import ConfigError, EngineConfig
from metroline.core.experiments.runner import run_workload
from metroline.core.results.horizon import MeasurementWindow
from metroline.core.workloads.build import build_workload
from metroline.executors.registry import make_executor

POOLS = {"router": "length_pools", "router_options": {"threshold": 512}, "pools": {
    "short": {"replicas": 3, "policy": "srpt", "config": {"max_num_seqs": 16},
              "canary": {"replicas": 1, "policy": "fcfs", "percent": 25.0}},
    "long": {"replicas": 1, "plugins": ["decode_first"]},
}}


def sim():
    return make_executor("sim")


def test_plan_gives_each_replica_its_pool_and_arm_config():
    plans = ClusterSpec.model_validate(POOLS).plan(EngineConfig(num_blocks=512, max_num_seqs=64))
    assert [(p.name, p.pool, p.arm, p.policy) for p in plans] == [
        ("short-0", "short", "baseline", "srpt"), ("short-1", "short", "baseline", "srpt"),
        ("short-canary-0", "short", "canary", "fcfs"), ("long-0", "long", None, "fcfs+decode_first"),
    ]
    assert [p.config.max_num_seqs for p in plans] == [16, 16, 16, 64]  # the canary keeps its pool's config
    assert {p.config.num_blocks for p in plans} == {512}
    assert [p.index for p in plans] == [0, 1, 2, 3]


@pytest.mark.parametrize("table,message", [
    ({"pools": {"a": {"replicas": 2, "config": {"max_num_seqs": 0}}}},
     "cluster.pools.a.config: max_num_seqs: input should be greater than or equal to 1"),
    ({"pools": {"a": {"replicas": 2, "config": {"max_num_seq": 4}}}},
     "cluster.pools.a.config: max_num_seq: unknown key"),
    ({"pools": {"a": {"replicas": 1, "canary": {"percent": 10.0}}}},
     "canary: replicas (1) must leave the baseline at least one of the pool's 1"),
    ({"pools": {"a": {"replicas": 2, "canary": {"percent": 10.0, "tenants": ["x"]}}}},
     "percent: give the canary's traffic as percent or as tenants, exactly one"),
    ({"pools": {"a": {"replicas": 2, "canary": {"percent": 100.0}}}}, "percent: input should be less than 100"),
    ({"replicas": 2, "pools": {"a": {}}}, "give replicas (one pool) or pools, not both"),
    ({"replica": 2}, "replica: unknown key"),
])
def test_a_bad_cluster_table_names_the_field(table, message):
    with pytest.raises(ConfigError) as err:
        cluster_spec(table, source="c.toml").plan(EngineConfig())
    assert message in str(err.value)


def test_flags_override_the_table():
    spec = cluster_spec(POOLS, pools={"short": 2, "extra": 1}, router="round_robin")
    assert list(spec.pools) == ["short", "extra"]
    assert spec.pools["short"].policy == "srpt" and spec.pools["short"].replicas == 2  # kept its engine and canary
    assert spec.pools["extra"].policy is None
    assert spec.router == "round_robin" and spec.router_options == {}  # the table's options were length_pools'
    assert cluster_spec(POOLS, replicas=3).num_replicas == 3
    with pytest.raises(ConfigError, match="not both"):
        cluster_spec(None, replicas=2, pools={"a": 1})


def _targets(table):
    spec = ClusterSpec.model_validate(table)
    plans = spec.plan(EngineConfig())
    return RouteTargets(spec, plans, lambda i, pos: ReplicaView.of(pos, name=plans[i].name, pool=plans[i].pool))


def test_a_percent_split_is_exact_and_evenly_interleaved():
    targets = _targets({"pools": {"p": {"replicas": 3, "canary": {"replicas": 1, "percent": 10.0}}}})
    arms = [targets.arms(RouteRequest(str(k), 0.0, [1, 2], 4)) for k in range(1000)]
    canary = [k for k, a in enumerate(arms) if a == ("canary",)]
    assert len(canary) == 100
    assert all(b - a == 10 for a, b in zip(canary, canary[1:]))  # one in every ten, in turn


def test_a_request_sees_only_its_arm_and_the_other_pools_with_positions_as_indexes():
    targets = _targets({"pools": {"p": {"replicas": 3, "canary": {"replicas": 1, "tenants": ["beta"]}},
                                  "q": {"replicas": 1}}})
    views, indexes = targets.for_request(RouteRequest("1", 0.0, [1], 4, tenant="beta"))
    assert [v.name for v in views] == ["p-canary-0", "q-0"] and indexes == [2, 3]
    assert [v.index for v in views] == [0, 1]
    views, indexes = targets.for_request(RouteRequest("2", 0.0, [1], 4, tenant="alpha"))
    assert [v.name for v in views] == ["p-0", "p-1", "q-0"] and indexes == [0, 1, 3]
    targets.set_down(1)
    views, indexes = targets.for_request(RouteRequest("3", 0.0, [1], 4, tenant="alpha"))
    assert [v.name for v in views] == ["p-0", "q-0"] and indexes == [0, 3] and targets.live == 3


def test_a_simulated_canary_runs_each_arm_on_its_own_stack():
    wl = build_workload("chat", seed=4, max_requests=400, rate_scale=0.1)
    spec = ClusterSpec.model_validate({"pools": {"p": {"replicas": 2, "canary": {
        "replicas": 1, "percent": 50.0, "policy": "srpt", "config": {"max_num_seqs": 8}}}}})
    doc, engines = run_cluster(wl, EngineConfig(num_blocks=1024), sim, spec=spec)
    assert [e.config.policy for e in engines] == ["fcfs", "srpt"]
    assert [e.config.max_num_seqs for e in engines] == [256, 8]
    assert [r["routed"] for r in doc["replicas"]] == [200, 200]
    canary = doc["canary"]["p"]
    assert canary["policy"] == {"baseline": "fcfs", "canary": "srpt"}
    assert canary["comparison"]["requests"] == {"baseline": 200, "canary": 200}
    assert canary["summary"]["canary"]["completed"] == 200


def test_one_replica_with_a_horizon_is_the_single_engine_with_it():
    wl = build_workload("chat", seed=2, max_requests=300, rate_scale=0.5)
    config = EngineConfig(num_blocks=256)
    window = MeasurementWindow(0.5, 2.0)
    single, _ = run_workload(wl, config, sim(), measure=window)
    doc, _ = run_cluster(wl, config, sim, replicas=1, measure=window)
    assert single["summary"]["unfinished"] > 0  # the horizon cut requests off
    drop = ("wall_s",)
    assert {k: v for k, v in doc["summary"].items() if k not in drop} == {
        k: v for k, v in single["summary"].items() if k not in drop}
    assert doc["measurement"] == single["measurement"]
    assert doc["replicas"][0]["summary"]["unfinished"] == single["summary"]["unfinished"]


def test_run_with_a_cluster_table_and_canary_report(tmp_path, capsys):
    config = tmp_path / "c.toml"
    config.write_text('num_blocks = 1024\n[cluster]\nrouter = "least_outstanding_tokens"\n'
                      '[cluster.pools.online]\nreplicas = 3\n'
                      '[cluster.pools.online.canary]\nreplicas = 1\npercent = 34\nconfig = { max_num_seqs = 2 }\n')
    out = tmp_path / "doc.json"
    assert cli.main(["run", "--config", str(config), "--max-requests", "300", "--rate-scale", "0.2",
                     "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [r["name"] for r in doc["replicas"]] == ["online-0", "online-1", "online-canary-0"]
    assert doc["canary"]["online"]["comparison"]["verdict"] == "worse"  # 2 sequences at a time: planted slower
    capsys.readouterr()
    assert cli.main(["canary-report", str(out), "--fail-on-worse"]) == 1
    text = capsys.readouterr().out
    assert "canary online (fcfs -> fcfs; max_num_seqs 256 -> 2)" in text and "verdict worse" in text
    assert cli.main(["canary-report", str(out)]) == 0


PREFIXES = """num_requests = 240
rate = 40.0
prompt_len = { dist = "uniform", low = 32, high = 96 }
output_len = { dist = "uniform", low = 8, high = 32 }
shared_prefix_len = 512
num_prefixes = 12
"""


def test_compare_routers_over_seeds_gives_verdicts(tmp_path):
    # 5 draws: too few for max-T at 5%, so Holm over the whole table (3 draws cannot clear it)
    out, spec = tmp_path / "cmp.json", tmp_path / "prefixes.toml"
    spec.write_text(PREFIXES)  # 12 system prompts, and room for about 4 of them per replica
    assert cli.main(["compare", "--routers", "round_robin,prefix_aware", "--replicas", "3", "--workload",
                     str(spec), "--num-blocks", "96", "--seeds", "5", "--jobs", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    comparison = result["comparison"]
    assert comparison["baseline"] == "round_robin" and set(comparison["policies"]) == {"round_robin", "prefix_aware"}
    for metric in ("summary.prefix_hit_rate", "summary.ttft_s.mean"):
        entry = comparison["policies"]["prefix_aware"][metric]
        assert entry["vs_baseline"]["verdict"] == "better", (metric, entry)
    assert [d["cluster"]["router"] for d in result["runs"][:2]] == ["round_robin", "prefix_aware"]
    assert all(d["cluster"]["replicas"] == 3 for d in result["runs"])


def test_compare_refuses_routers_and_several_policies():
    assert cli.main(["compare", "--routers", "round_robin", "--policies", "fcfs,srpt", "--replicas", "2"]) == 2


def test_sweep_refuses_a_cluster_table_instead_of_ignoring_it(tmp_path, capsys):
    config = tmp_path / "c.toml"
    config.write_text("[cluster]\nreplicas = 2\n")
    assert cli.main(["sweep", "--config", str(config), "--rates", "1", "--slo", "ttft=1", "--max-requests", "10"]) == 2
    assert "cluster: sweep runs one engine per rate" in capsys.readouterr().err


def test_the_default_pool_is_named_r_i_however_it_is_declared():
    from metroline.core.cluster.spec import cluster_spec
    from metroline.core.config import EngineConfig

    flags = cluster_spec(None, replicas=3).plan(EngineConfig())
    table = cluster_spec({"pools": {"default": {"replicas": 2}, "long": {"replicas": 1}}}).plan(EngineConfig())
    assert [p.name for p in flags] == ["r0", "r1", "r2"]
    assert [p.name for p in table] == ["r0", "r1", "long-0"]


def test_router_option_values_are_json_and_replica_names_are_checked():
    from metroline.core.cluster.spec import cluster_spec, parse_router_options
    from metroline.core.config import ConfigError, EngineConfig

    assert parse_router_options(["threshold=2048", "long_pool=long", 'tenant_replicas={"a": "r0"}', "strict=true",
                                 "weights=[1, 2.5]"]) == {
        "threshold": 2048, "long_pool": "long", "tenant_replicas": {"a": "r0"}, "strict": True, "weights": [1, 2.5]}
    ok = cluster_spec(None, replicas=2, router_options={"tenant_replicas": {"a": "r1"}, "fallback_replica": "r0"})
    assert [p.name for p in ok.plan(EngineConfig())] == ["r0", "r1"]
    bad = cluster_spec(None, pools={"short": 2}, router_options={"tenant_replicas": {"a": ["short-1", "r0"]}})
    with pytest.raises(ConfigError, match=r"router_options\.tenant_replicas\.a\[1\]: no replica named 'r0' "
                                          r"\(replicas: short-0, short-1\)"):
        bad.plan(EngineConfig())
