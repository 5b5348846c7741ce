"""The demonstrations of the contrib plugins (tenant_quota, prefix_aware, slo_classes), printed.

Runs the same seeded workloads and engines as `tests/test_contrib_*.py` (it imports their
helpers, so the figures are the ones the tests assert) under the `steps` cost model (0.01 s a
step) and prints each plugin's figures next to the run without it.

Run:  .venv/bin/python bench/contrib.py
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import test_contrib_prefix_aware as pa  # noqa: E402
import test_contrib_slo_classes as slo  # noqa: E402
import test_contrib_tenant_quota as tq  # noqa: E402

from metroline.core.workloads.build import Workload, WorkloadItem  # noqa: E402


def tenant_quota() -> None:
    print("== tenant_quota (fcfs base, 8 slots, 60 requests at t=0, tenants a/b 50/50)")
    for label, plugins, options in (
        ("fcfs", (), {}),
        ("fcfs + tenant_quota max_running {a: 2}", ("tenant_quota",), {"tenant_quota": {"max_running": {"a": 2}}}),
    ):
        census = tq.Census()
        doc, _ = tq.run(tq.two_tenants(), [census], plugins=plugins, options=options, max_num_seqs=8)
        busy = Counter((r["a"], r["b"]) for r, w in census.rows if w["b"] > 0)
        print(f"  {label:<42} max a running {max(r['a'] for r, _ in census.rows)}; "
              f"steps while b waits, by (a, b) running: {dict(busy.most_common(4))}")
    print("== tenant_quota token rate (80 requests, 40 req/s, a: 300 tokens/s, burst 400)")
    for label, plugins, options in (
        ("fcfs", (), {}),
        ("fcfs + tenant_quota", ("tenant_quota",), {"tenant_quota": {"token_rate": {"a": 300.0}, "burst": 400}}),
    ):
        ledger = tq.Ledger("a")
        doc, _ = tq.run(tq.two_tenants(num_requests=80, rate=40.0, seed=2), [ledger], plugins=plugins,
                        options=options, max_num_seqs=16)
        excess = tq.worst_window_excess(ledger.events, 300.0)
        print(f"  {label:<22} worst window: charged - 300 x window = {excess:8.1f} tokens (bound: burst 400); "
              f"a queue max {doc['tenants']['a']['queue_s']['max']:.3f} s, b {doc['tenants']['b']['queue_s']['max']:.3f} s")
    items = [WorkloadItem(0.0, ((("tq-refill", i), 64),), 2, tenant="a") for i in range(3)]
    _, engine = tq.run(Workload("refill", items), [],
                       options={"tenant_quota": {"token_rate": {"a": 100}, "burst": 100}})
    first = {r.id: round(r.first_scheduled_s, 3) for r in engine.metrics.requests}
    print(f"  3 prompts of 64 at t=0, 100 tokens/s, burst 100: admitted at {first}")


def prefix_aware() -> None:
    print("== prefix_aware: hit rate (400 requests at 1.1x capacity, 16 system prompts of 512 tokens, "
          "20 % cold, 400 blocks)")
    wl = pa.hot_and_cold()
    for policy in ("fcfs", "prefix_aware"):
        doc, _ = pa.run(wl, policy=policy, num_blocks=400)
        s = doc["summary"]
        print(f"  {policy:<13} prefix hit rate {s['prefix_hit_rate']:.4f}  preemptions {s['preemptions']:3d}  "
              f"duration {s['duration_s']:.2f} s  wall {s['wall_s'] * 1e6 / s['steps']:.0f} us/step")
    print("== prefix_aware: a hot stream (400 requests at 1.1x capacity) and 4 cold requests at t = 1..4 s (seed 1)")
    wl = pa.hot_stream_with_cold(seed=1)
    for label, policy, options in (
        ("fcfs", "fcfs", {}),
        ("aging 1000 tokens/s", "prefix_aware", {}),
        ("plain LPM (aging 0)", "prefix_aware", {"aging_rate": 0}),
    ):
        log = pa.AdmissionLog()
        doc, _ = pa.run(wl, policy=policy, options=options, observers=[log])
        pairs = pa.overtakes(log.order)
        worst = max((o.arrival_time - c.arrival_time for c, o in pairs), default=0.0)
        print(f"  {label:<20} cold max wait {doc['tenants']['cold']['queue_s']['max']:.3f} s; "
              f"latest overtaker arrived {worst:.3f} s after the request it overtook (bound with aging: 0.543 s)")


def slo_classes() -> None:
    print("== slo_classes: base split of at most 4 decode tokens; 8 batch then 4 interactive requests at t=0")
    for label, plugins in (("fcfs", ()), ("fcfs + slo_classes", ("slo_classes",))):
        log = slo.DecodeLog()
        doc, _ = slo.run(slo.twelve_at_once(), plugins=plugins, observers=[slo.DecodeCap(4), log],
                         max_num_seqs=16, max_num_batched_tokens=16)
        steps = [(w, s) for w, s in zip(log.wanting, log.served) if w["chat"]]
        short = sum(s["chat"] < w["chat"] for w, s in steps)
        t = doc["tenants"]
        print(f"  {label:<18} steps where an interactive decode waited: {short:3d}; ITL max interactive "
              f"{t['chat']['itl_s']['max'] * 1000:.0f} ms, batch {t['batch']['itl_s']['max'] * 1000:.0f} ms")
    print("== slo_classes: mixed workload (600 requests at 1.1x capacity of 32 slots, 30 % interactive), "
          "base split of at most 16 decode tokens")
    for label, plugins in (("fcfs", ()), ("fcfs + slo_classes", ("slo_classes",))):
        doc, _ = slo.run(slo.mixed(), plugins=plugins, observers=[slo.DecodeCap(16)], max_num_seqs=32,
                         max_num_batched_tokens=256)
        c, b = doc["tenants"]["chat"], doc["tenants"]["batch"]
        print(f"  {label:<18} p99 interactive / batch (ms): TPOT {c['tpot_s']['p99'] * 1000:.1f} / "
              f"{b['tpot_s']['p99'] * 1000:.1f}  ITL {c['itl_s']['p99'] * 1000:.1f} / {b['itl_s']['p99'] * 1000:.1f}  "
              f"TTFT {c['ttft_s']['p99'] * 1000:.0f} / {b['ttft_s']['p99'] * 1000:.0f}")


if __name__ == "__main__":
    tenant_quota()
    prefix_aware()
    slo_classes()
