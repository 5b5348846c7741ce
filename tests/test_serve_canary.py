"""A canary while serving (`[cluster.pools.NAME.canary]` under `metroline serve`): the front splits
the pool's traffic between its arms exactly, each arm's replicas run their own engine, and
`/v1/canary`, `/metrics` and `metroline canary-report` compare the arms: a planted slower arm (the
canary runs one sequence at a time) is called worse. (That an A/A canary is not called different
more often than the interval's level allows is shown on the simulated cluster, where trials are
cheap: tests/test_canary_trials.py; the comparison is the same code.)"""

from __future__ import annotations

import asyncio


import httpx
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from test_serve import metrics  # noqa: E402
from test_serve_replicas import SIM, routed, start_front  # noqa: E402

from metroline import cli  # noqa: E402

CLUSTER = """
[cluster]
router = "least_outstanding_tokens"
[cluster.pools.online]
replicas = 2
[cluster.pools.online.canary]
replicas = 1
percent = 50
config = { max_num_seqs = 1 }
"""


async def _stream(client: httpx.AsyncClient, url: str, i: int) -> int:
    body = {"model": "sim", "prompt": f"canary request {i}", "max_tokens": 16, "stream": True, "ignore_eos": True}
    events = 0
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            events += line.startswith("data: {")
    return events


async def _waves(url: str, waves: int, per_wave: int) -> list[int]:
    async with httpx.AsyncClient(timeout=60) as client:
        out = []
        for w in range(waves):
            out += await asyncio.gather(*(_stream(client, url, w * per_wave + k) for k in range(per_wave)))
            await asyncio.sleep(0.05)
        return out


@pytest.fixture(scope="module")
def canary_front(tmp_path_factory):
    config = tmp_path_factory.mktemp("canary") / "cluster.toml"
    config.write_text(CLUSTER)
    front = start_front("--config", str(config), *SIM)
    yield front
    front.stop()


def test_the_canary_arm_gets_its_share_and_runs_its_own_engine(canary_front):
    url = canary_front.url
    states = {r["name"]: r["state"] for r in httpx.get(url + "/v1/replicas").json()["replicas"]}
    assert set(states) == {"online-0", "online-canary-0"}
    assert states["online-0"]["policy"] == states["online-canary-0"]["policy"] == "fcfs"
    # 28 waves: the canary queues 4 requests a wave, so the run spans about 7 windows of 4 of its
    # requests' lifetimes (fewer, and the comparison would give no verdict: too short)
    events = asyncio.run(_waves(url, 28, 8))
    assert min(events) >= 8, sorted(events)  # every stream streamed (a slow reader may get tokens together)
    assert routed(url) == {"online-0": 112.0, "online-canary-0": 112.0}  # 50%: exactly every other request
    m = metrics(url)
    counts = {dict(labels)["arm"]: v for (name, labels), v in m.items()
              if name == "metroline_front_canary_ttft_seconds_count"}
    assert counts == {"baseline": 112.0, "canary": 112.0}


def test_a_planted_slower_canary_is_called_worse(canary_front, capsys):
    url = canary_front.url
    report = httpx.get(url + "/v1/canary").json()
    online = report["pools"]["online"]
    assert online["policy"] == {"baseline": "fcfs", "canary": "fcfs"}
    assert len(online["rows"]["baseline"]) == len(online["rows"]["canary"]) >= 32
    comparison = online["comparison"]
    ttft = comparison["metrics"]["ttft_mean"]
    assert ttft["canary"] > 1.3 * ttft["baseline"], comparison  # one sequence at a time: the canary queues
    assert comparison["verdict"] == "worse" and ttft["verdict"] == "worse"
    capsys.readouterr()
    assert cli.main(["canary-report", url, "--fail-on-worse"]) == 1
    assert "canary online (fcfs -> fcfs; max_num_seqs 256 -> 1)" in capsys.readouterr().out


def test_no_canary_is_a_404(tmp_path):
    front = start_front("--replicas", "1", *SIM)
    try:
        r = httpx.get(front.url + "/v1/canary")
        assert r.status_code == 404 and "no pool of this cluster has a canary" in r.json()["error"]["message"]
    finally:
        front.stop()

