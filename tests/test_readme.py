"""The README's examples run as written."""

import re
import sys
from pathlib import Path

from metroline.core.config import EngineConfig
from metroline.core.experiments.runner import run_workload
from metroline.core.plugins.hookspecs import hookimpl
from metroline.core.workloads.build import SyntheticSpec, Workload, generate
from metroline.executors.cost_models import make_cost_model
from metroline.executors.simulated import SimulatedExecutor

README = (Path(__file__).parents[1] / "README.md").read_text()


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, re.S)


def test_the_plugin_example_caps_the_batch_tenant(tmp_path, monkeypatch):
    (example,) = [b for b in python_blocks() if "class BatchCap" in b]
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "quota.py").write_text(example)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("mypkg", None)
    spec = SyntheticSpec(num_requests=120, rate=None, prompt_len=32, output_len=16,
                         tenants={"batch": 0.7, "chat": 0.3}, seed=3)
    workload = Workload("mix", generate(spec), "", {})
    peaks = []

    class Watch:
        name = "watch"

        @hookimpl
        def on_step_end(self, ctx):
            peaks.append(sum(s.tenant == "batch" for s in ctx.running))

    config = EngineConfig(policy="fcfs", plugins=["mypkg.quota:BatchCap"], max_num_seqs=16,
                          plugin_options={"batch_cap": {"limit": 4}})
    doc, _ = run_workload(workload, config, SimulatedExecutor(make_cost_model("steps")), plugins=[Watch()])
    assert doc["summary"]["completed"] == 120
    assert max(peaks) == 4  # the cap binds, and is never exceeded
    without = EngineConfig(policy="fcfs", max_num_seqs=16)
    peaks.clear()
    run_workload(workload, without, SimulatedExecutor(make_cost_model("steps")), plugins=[Watch()])
    assert max(peaks) > 4


def test_the_engine_example_streams_two_samples():
    (example,) = [b for b in python_blocks() if "engine.stream()" in b]
    seen = []
    exec(example, {"print": lambda *a: seen.append(a)})
    finished = [a for a in seen if a[3]]
    assert sorted(a[1] for a in finished) == [0, 1]  # n=2: two samples, each ends once
    assert all(a[4] == "length" for a in finished)
    assert len(seen) == 2 * 8  # one output per token per sample


def test_the_config_file_example_runs(tmp_path, capsys):
    from metroline import cli

    (block,) = [b for b in re.findall(r"```toml\n(.*?)```", README, re.S) if "[run]" in b]
    path = tmp_path / "my.toml"
    path.write_text(block)
    assert cli.main(["run", "--config", str(path), "--max-requests", "50"]) == 0
    out = capsys.readouterr().out
    assert "policy weighted_fair+decode_first | workload chat" in out
    assert re.search(r"requests\s+50\s+completed\s+50\n", out)
