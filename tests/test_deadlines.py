"""Per-request deadlines: `deadline_s` in a request file (or a `WorkloadItem`) reaches plugins as
`seq.deadline` (arrival + deadline_s, on the engine's clock) and becomes the `deadlines` metric of
`run` (overall and per tenant), which `compare` pairs like any other metric."""

from __future__ import annotations

import json

from metroline import cli
from metroline.api import hookimpl
from metroline.core.results.deadlines import deadline_figures
from metroline.core.results.paired import PAIRED_METRICS, metric_kind, metric_value


def request_file(tmp_path):
    """Six requests: a's arrive at 0 with a deadline no step can meet (1 us) or a loose one (1000 s);
    b's at 1 s, loose; one without a deadline."""
    lines = [
        {"id": "a0", "prompt_token_ids": [1, 2, 3], "max_new_tokens": 8, "tenant": "a", "deadline_s": 1e-6},
        {"id": "a1", "prompt_token_ids": [4, 5, 6], "max_new_tokens": 8, "tenant": "a", "deadline_s": 1e-6},
        {"id": "a2", "prompt_token_ids": [7, 8, 9], "max_new_tokens": 8, "tenant": "a", "deadline_s": 1000.0},
        {"id": "b0", "prompt_token_ids": [1, 2], "max_new_tokens": 4, "tenant": "b", "arrival_s": 1.0,
         "deadline_s": 1000.0},
        {"id": "b1", "prompt_token_ids": [3, 4], "max_new_tokens": 4, "tenant": "b", "arrival_s": 1.0,
         "deadline_s": 1000.0},
        {"id": "c0", "prompt_token_ids": [5, 6], "max_new_tokens": 4, "tenant": "b"},
    ]
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


class SeeDeadlines:
    name = "see_deadlines"
    seen: dict = {}

    @hookimpl
    def on_arrival(self, seqs):
        for s in seqs:
            SeeDeadlines.seen[s.request_id] = (s.arrival_time, s.deadline)


def test_run_reports_deadline_attainment_overall_and_per_tenant(tmp_path, capsys):
    out_json = tmp_path / "run.json"
    assert cli.main(["run", "--workload", str(request_file(tmp_path)), "--json", str(out_json)]) == 0
    printed = capsys.readouterr().out
    figures = json.loads(out_json.read_text())["deadlines"]
    # 5 requests have a deadline; the two of 1 us miss it (no step takes no time), the three loose ones meet it
    assert (figures["requests"], figures["met"], figures["attainment"]) == (5, 3, 0.6)
    assert figures["by_tenant"] == {"a": {"requests": 3, "met": 1, "attainment": 1 / 3},
                                    "b": {"requests": 2, "met": 2, "attainment": 1.0}}
    assert "deadlines met: 60.0% of 5 (a 33.3%, b 100.0%)" in printed
    assert metric_value({"deadlines": figures}, ("deadlines", "attainment")) == 0.6
    assert ("deadlines met", ("deadlines", "attainment"), "higher", 100.0, "%") in PAIRED_METRICS
    assert metric_kind(("deadlines", "attainment")) == "share"  # its minimum effect is a share's, not a count's


def test_plugins_see_an_absolute_deadline(tmp_path):
    from metroline.core.config import EngineConfig
    from metroline.core.experiments.runner import run_workload
    from metroline.core.workloads.build import build_workload
    from metroline.executors.cost_models import make_cost_model
    from metroline.executors.simulated import SimulatedExecutor

    SeeDeadlines.seen = {}
    workload = build_workload(str(request_file(tmp_path)))
    doc, _ = run_workload(workload, EngineConfig(), SimulatedExecutor(make_cost_model("steps")),
                          plugins=[SeeDeadlines()])
    assert SeeDeadlines.seen["b0"] == (1.0, 1001.0) and SeeDeadlines.seen["c0"] == (0.0, None)
    assert doc["deadlines"]["requests"] == 5


def test_no_deadline_no_figures():
    assert deadline_figures([], {}) is None


def test_serve_counts_deadlines_met_per_tenant_in_metrics_and_its_summary(capsys):
    """Through HTTP: alpha's request has a deadline it meets, beta's one shorter than a single
    step (it needs three: a prefill step and two decode steps), a third has none. `/metrics`
    counts 2 requests with a deadline, 1 met, per tenant; the server's summary says the same."""
    import httpx
    import pytest

    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    from prometheus_client.parser import text_string_to_metric_families

    from metroline.core.commands.serve import print_summary
    from metroline.core.config import EngineConfig
    from metroline.core.results.deadlines import deadline_line
    from metroline.core.serving.server import ServerThread, make_engine
    from metroline.core.serving.tenants import ServeConfig
    from metroline.executors.cost_models import make_cost_model
    from metroline.executors.realtime import RealtimeExecutor
    from metroline.executors.simulated import SimulatedExecutor

    step = 0.02
    executor = RealtimeExecutor(SimulatedExecutor(make_cost_model("steps", step_time=step)))
    tenants = {"alpha": {"api_keys": ["key-a"]}, "beta": {"api_keys": ["key-b"]}}
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}
    with ServerThread(make_engine(EngineConfig(), executor), ServeConfig(tenants=tenants, public_metrics=True)) as srv:
        srv.server_state.on_stop = print_summary  # as `metroline serve` does
        url = srv.url + "/v1/chat/completions"
        sent = [({**body, "deadline_s": 60.0}, "key-a"), ({**body, "deadline_s": step}, "key-b"), (body, "key-a")]
        for json_body, key in sent:
            r = httpx.post(url, json=json_body, headers={"Authorization": f"Bearer {key}"}, timeout=30)
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        text = httpx.get(srv.url + "/metrics").text
        figures = srv.server_state.metrics.deadline_figures()
    samples = {(s.name, tuple(s.labels.values())): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples
               if "deadline" in s.name and not s.name.endswith("_created")}
    assert samples == {
        ("metroline_deadline_requests_total", ("alpha",)): 1, ("metroline_deadline_requests_total", ("beta",)): 1,
        ("metroline_deadline_met_total", ("alpha",)): 1, ("metroline_deadline_met_total", ("beta",)): 0,
        ("metroline_deadline_attainment", ()): 0.5,
        ("metroline_deadline_attainment_by_tenant", ("alpha",)): 1.0,
        ("metroline_deadline_attainment_by_tenant", ("beta",)): 0.0,
    }
    assert figures == {"requests": 2, "met": 1, "attainment": 0.5,
                       "by_tenant": {"alpha": {"requests": 1, "met": 1, "attainment": 1.0},
                                     "beta": {"requests": 1, "met": 0, "attainment": 0.0}}}
    assert deadline_line(figures) == "deadlines met: 50.0% of 2 (alpha 100.0%, beta 0.0%)"
    assert "metroline: deadlines met: 50.0% of 2 (alpha 100.0%, beta 0.0%)\n" in capsys.readouterr().err
