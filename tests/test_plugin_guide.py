"""docs/plugins.md runs as written: each file it shows is written out as shown, each command runs
(in a subprocess, from the folder holding those files), and each effect it claims is checked.

A block whose first line is `# file: PATH` is a file; every other block is claimed by exactly one
test below (`SNIPPETS`, `COMMANDS`), and `test_every_block_is_run` checks that none is left out.
`pip install -e ./acme-tenants` is stood in for by the metadata the install writes (a dist-info
folder with the entry points of the package's pyproject.toml, and its `src` on the path); the slow
test `test_the_package_really_installs` builds and installs it with pip.
"""

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path

import pytest

from metroline.core.config import EngineConfig
from metroline.core.errors import PluginError, PluginLoadError
from metroline.core.experiments.runner import run_workload
from metroline.core.plugins.hookspecs import hookimpl
from metroline.core.requests.request import Request, SamplingParams
from metroline.core.requests.sequence import RUNNING, Sequence
from metroline.core.step.engine import Engine
from metroline.core.workloads.build import SyntheticSpec, Workload, generate, load_spec
from metroline.executors.cost_models import make_cost_model
from metroline.executors.simulated import SimulatedExecutor
from metroline.testing import ConformanceError, check_plugin

ROOT = Path(__file__).parents[1]
GUIDE = (ROOT / "docs" / "plugins.md").read_text()
BLOCKS = re.findall(r"^```(\w+)\n(.*?)^```", GUIDE, re.S | re.M)
FILES = {b.splitlines()[0][len("# file: "):]: b for _, b in BLOCKS if b.startswith("# file: ")}


def commands() -> list[str]:
    """The guide's shell commands, one per line."""
    return [line.strip() for lang, b in BLOCKS if lang == "bash" for line in b.splitlines() if line.strip()]


def command(*words: str) -> str:
    (line,) = [c for c in commands() if all(w in c for w in words)]
    return line


def text_block(containing: str) -> str:
    (block,) = [b for lang, b in BLOCKS if lang == "text" and containing in b]
    return block


@pytest.fixture(scope="module")
def guide(tmp_path_factory):
    """A folder with every file of the guide, and acme-tenants 'installed' (see the docstring)."""
    root = tmp_path_factory.mktemp("guide")
    for path, body in FILES.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(body)
    project = tomllib.loads(FILES["acme-tenants/pyproject.toml"])["project"]
    dist = root / "site" / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    groups = project["entry-points"]
    (dist / "entry_points.txt").write_text(
        "".join(f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) for g, eps in groups.items())
    )
    return root


def shell(guide: Path, line: str, timeout: int = 300) -> str:
    """Run one of the guide's commands in the guide's folder, as a user would (bash), with the
    venv's scripts first on PATH and acme-tenants installed; returns its stdout."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(guide / "site"), str(guide / "acme-tenants" / "src"), str(ROOT.parent)])
    env.pop("PYTEST_ADDOPTS", None)
    proc = subprocess.run(["bash", "-c", line], cwd=guide, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{line}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture
def on_path(guide, monkeypatch):
    """The guide's folder on sys.path (what PYTHONPATH=. gives a command), and its modules fresh."""
    monkeypatch.syspath_prepend(str(guide))
    monkeypatch.syspath_prepend(str(guide / "acme-tenants" / "src"))
    monkeypatch.chdir(guide)
    ours = {p.removesuffix(".py") for p in FILES if p.endswith(".py") and "/" not in p} | {"acme_tenants"}
    for name in [m for m in sys.modules if m.split(".")[0] in ours]:
        del sys.modules[name]
    return guide


def simulate(workload, config, plugins=()):
    doc, _ = run_workload(workload, config, SimulatedExecutor(make_cost_model("steps")), plugins=list(plugins))
    return doc


def tenants_workload(guide) -> Workload:
    return Workload("tenants", generate(load_spec(guide / "tenants.toml")), "", {})


# --- the shape of a plugin -----------------------------------------------------------------------


def test_quiet_batch_admits_batch_only_while_half_the_pool_is_free(guide, on_path):
    out = shell(guide, command("quiet_batch:QuietBatch"))
    assert re.search(r"quiet_batch\s+admission", out)
    roomy_steps, batch_steps = set(), set()

    class Watch:  # an outer wrapper: sees the pool as QuietBatch does, before any admission
        name = "watch"

        @hookimpl(wrapper=True)
        def admission(self, ctx):
            if 2 * ctx.num_free_blocks() >= ctx.num_blocks:
                roomy_steps.add(ctx.step)
            return (yield)

        @hookimpl
        def on_admitted(self, ctx, seqs):
            batch_steps.update(ctx.step for s in seqs if s.tenant == "batch" and s.parent is None)

    config = EngineConfig(policy="fcfs", plugins=["quiet_batch:QuietBatch"], max_num_seqs=32, num_blocks=300)
    doc = simulate(tenants_workload(guide), config, [Watch()])
    assert doc["summary"]["completed"] == doc["summary"]["requests"]
    assert batch_steps and batch_steps <= roomy_steps
    assert roomy_steps != set(range(1, doc["summary"]["steps"] + 1))  # the pool was busy at times
    with pytest.raises(PluginLoadError, match="quiet_batch"):  # an unknown option names the plugin
        options = {"quiet_batch": {"tenat": "x"}}
        Engine(EngineConfig(policy="fcfs", plugins=["quiet_batch:QuietBatch"], plugin_options=options))


# --- a platform plugin, packaged -----------------------------------------------------------------


def test_the_package_declares_its_entry_point_in_metrolines_group():
    from metroline.core.plugins.loader import ENTRY_POINT_GROUP

    project = tomllib.loads(FILES["acme-tenants/pyproject.toml"])["project"]
    assert project["entry-points"][ENTRY_POINT_GROUP] == {"acme_tenants": "acme_tenants.plugin:AcmeTenants"}
    tree = text_block("pyproject.toml")
    assert all(Path(p).name in tree for p in FILES if p.startswith("acme-tenants/src/"))


def test_the_installed_plugin_is_found_by_its_entry_point(guide):
    assert command("pip install", "acme-tenants") == "pip install -e ./acme-tenants"  # stood in for by the fixture
    out = shell(guide, command("plugins", "acme_tenants"))
    hooks = "admission, on_admitted, on_arrival, on_finished, on_preempted, select_victim"
    assert re.search(rf"acme_tenants\s+{hooks}", out)
    assert "entry points: acme_tenants (acme_tenants.plugin:AcmeTenants)" in out
    assert "cap_share (float > 0, <= 1, default 0.25): the share of max_num_seqs it may hold" in out


def test_a_bad_option_of_the_packaged_plugin_names_plugin_and_option(guide, on_path):
    options = {"acme_tenants": {"cap_share": 2}}
    bad = EngineConfig(policy="fcfs", plugins=["acme_tenants:AcmeTenants"], plugin_options=options)
    with pytest.raises(PluginLoadError, match="plugin 'acme_tenants': option 'cap_share': "):
        Engine(bad)


def test_acme_tenants_compare_shows_enterprise_first(guide):
    out = shell(guide, command("compare", "acme_tenants"))
    assert "TTFT p99 enterprise" in out
    without, with_plugin = json.loads((guide / "acme.json").read_text())["runs"]
    assert with_plugin["policy"] != without["policy"]
    for doc in (without, with_plugin):
        assert doc["summary"]["completed"] == doc["summary"]["requests"] == 600
        assert doc["summary"]["preemptions"] > 0  # the pool is small enough to preempt
    p99 = [d["tenants"]["enterprise"]["ttft_s"]["p99"] for d in (without, with_plugin)]
    assert p99[1] * 10 < p99[0]  # "falls more than tenfold"


def test_acme_tenants_caps_free_and_preempts_batch_first(guide, on_path):
    from acme_tenants import AcmeTenants

    config_file = tomllib.loads((guide / "acme.toml").read_text())
    cap = int(config_file["plugin_options"]["acme_tenants"]["cap_share"] * config_file["max_num_seqs"])
    peaks, victims = [], []

    class Watch:
        name = "watch"

        @hookimpl(hookwrapper=True)  # outermost: sees the final victim, before it is preempted
        def select_victim(self, ctx):
            outcome = yield
            victim = outcome.get_result()
            victim = getattr(victim, "seq", victim)
            if victim is not None:
                victims.append((victim.tenant, any(s.tenant == "batch" for s in ctx.running)))

        @hookimpl
        def on_step_end(self, ctx):
            peaks.append(sum(s.tenant == "free" for s in ctx.running))

    fields = {k: v for k, v in config_file.items() if k not in ("run", "plugin_options")}
    doc = simulate(tenants_workload(guide), EngineConfig(policy="fcfs", **fields), [AcmeTenants(), Watch()])
    assert doc["summary"]["completed"] == doc["summary"]["requests"]
    assert max(peaks) == cap == 8  # binds, never exceeded
    assert victims and all(tenant == "batch" for tenant, batch_ran in victims if batch_ran)
    assert any(batch_ran for _, batch_ran in victims)
    peaks.clear()
    simulate(tenants_workload(guide), EngineConfig(policy="fcfs", **fields), [Watch()])
    assert max(peaks) > cap  # without the plugin free takes more


# --- a research policy by dotted path ------------------------------------------------------------


def test_a_module_in_the_current_folder_loads_without_pythonpath_and_a_missing_one_is_named(guide):
    """The guide's command, run in the folder of `hrrn.py` with no PYTHONPATH at all (the
    `metroline` script does not put the current folder on sys.path itself), loads it; a module
    that is nowhere stops the run with the error the guide quotes."""
    line = command("hrrn:HRRN", "compare")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    script = str(Path(sys.executable).parent / "metroline")
    proc = subprocess.run([script, "plugins", "--policy", "hrrn:HRRN"], cwd=guide, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^  hrrn\s+admission", proc.stdout, re.M), proc.stdout
    missing = [script, *(a.replace("hrrn:HRRN", "nowhere:HRRN") for a in shlex.split(line)[1:])]
    proc = subprocess.run(missing, cwd=guide, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "cannot import 'nowhere': No module named 'nowhere'" in proc.stderr
    assert "cannot import 'hrrn': No module named 'hrrn'" in GUIDE


def test_hrrn_sits_between_fcfs_and_srpt(guide):
    shell(guide, command("hrrn:HRRN", "compare"))
    fcfs, srpt, hrrn = json.loads((guide / "hrrn.json").read_text())["runs"]
    assert hrrn["policy"] == "hrrn:HRRN"
    assert hrrn["summary"]["completed"] == hrrn["summary"]["requests"] == 1000
    assert hrrn["summary"]["ttft_s"]["mean"] < fcfs["summary"]["ttft_s"]["mean"]
    assert hrrn["summary"]["ttft_s"]["max"] < srpt["summary"]["ttft_s"]["max"]


def test_las_more_than_halves_fcfs_mean_latency_and_pays_for_recomputation_under_roofline(guide):
    runs = {}
    for out in ("las.json", "las-roofline.json"):
        shell(guide, command("las:LAS", out))
        fcfs, las = json.loads((guide / out).read_text())["runs"]
        assert las["summary"]["completed"] == las["summary"]["requests"] == fcfs["summary"]["requests"]
        assert las["summary"]["preemptions"] > fcfs["summary"]["preemptions"]
        runs[out] = fcfs["summary"], las["summary"]
    (fcfs, las), (fcfs_r, las_r) = runs["las.json"], runs["las-roofline.json"]
    assert 2 * las["e2e_s"]["mean"] < fcfs["e2e_s"]["mean"]  # steps: "more than halves"
    assert las_r["e2e_s"]["mean"] < fcfs_r["e2e_s"]["mean"]  # roofline: still beats fcfs ...
    assert las_r["e2e_s"]["mean"] / fcfs_r["e2e_s"]["mean"] > las["e2e_s"]["mean"] / fcfs["e2e_s"]["mean"]  # by less
    assert las_r["output_throughput_tok_s"] < fcfs_r["output_throughput_tok_s"]  # and delivers fewer tokens/s


# --- the lazy-queue pattern ----------------------------------------------------------------------


def small_engine(**fields) -> Engine:
    return Engine(EngineConfig(**{"policy": "fcfs", "num_blocks": 64, **fields}))


def test_looping_over_ctx_waiting_fails_as_the_guide_shows(on_path):
    from broken_order import BrokenOrder

    engine = Engine(EngineConfig(policy="fcfs", num_blocks=64), plugins=[BrokenOrder()])
    for _ in range(3):
        engine.add_request(Request(prompt_token_ids=[1, 2, 3], sampling=SamplingParams(max_new_tokens=2)))
    with pytest.raises(PluginError) as err:
        engine.step()
    assert f"PluginError: {err.value}" == text_block("dictionary changed size").strip()


def test_queued_in_order_is_pulled_only_as_far_as_the_scheduler_looks(on_path):
    from small_when_busy import SmallWhenBusy

    pulled, admitted = Counter(), Counter()

    class Count:
        name = "count"

        @hookimpl(wrapper=True)
        def admission(self, ctx):
            answer = yield
            step = ctx.step

            def counted():
                for seq in answer:
                    pulled[step] += 1
                    yield seq

            return counted()

        @hookimpl
        def on_admitted(self, ctx, seqs):
            admitted[ctx.step] += sum(s.parent is None for s in seqs)

    engine = Engine(
        EngineConfig(policy="small_when_busy:SmallWhenBusy", max_num_seqs=8, num_blocks=256), plugins=[Count()]
    )
    for i in range(5000):
        engine.add_request(Request(prompt_token_ids=[1] * (64 + i % 400), sampling=SamplingParams(max_new_tokens=4)))
    for _ in range(40):
        engine.step()
    assert sum(admitted.values()) >= 8
    assert all(pulled[s] <= admitted[s] + 1 for s in pulled)  # "at most one more than it admits"
    assert max(pulled.values()) < 5000 / 100


def test_my_fcfs_schedules_exactly_as_fcfs(on_path):
    spec = SyntheticSpec(num_requests=300, rate=200.0, prompt_len={"dist": "uniform", "low": 8, "high": 600},
                         output_len={"dist": "uniform", "low": 1, "high": 200}, seed=5)
    workload = Workload("w", generate(spec), "", {})
    docs = [simulate(workload, EngineConfig(policy=p, max_num_seqs=16, num_blocks=200))
            for p in ("fcfs", "my_fcfs:MyFCFS")]
    assert docs[0]["summary"]["preemptions"] > 0
    for d in docs:
        d["summary"].pop("wall_s")
    assert docs[0]["summary"] == docs[1]["summary"]


def test_one_long_prompt_prefills_alone(on_path):
    spec = SyntheticSpec(num_requests=200, rate=50.0, prompt_len={"dist": "uniform", "low": 16, "high": 3000},
                         output_len={"dist": "uniform", "low": 1, "high": 64}, seed=2)
    workload = Workload("w", generate(spec), "", {})
    peaks = []

    class Watch:
        name = "watch"

        @hookimpl
        def on_step_end(self, ctx):
            peaks.append(sum(s.num_prompt_tokens >= 1024 and not s.is_decoding for s in ctx.running))

    config = dict(max_num_seqs=16, num_blocks=2048, max_prefill_chunk=256)
    stacked = EngineConfig(policy="fcfs", plugins=["one_long_prompt:OneLongPrompt"], **config)
    doc = simulate(workload, stacked, [Watch()])
    assert doc["summary"]["completed"] == 200
    assert max(peaks) == 1
    peaks.clear()
    simulate(workload, EngineConfig(policy="fcfs", **config), [Watch()])
    assert max(peaks) > 1


# --- stacking and wrappers -----------------------------------------------------------------------


def test_the_stack_of_estimators_answers_as_the_guide_says(guide, on_path):
    line = command("lengths:")
    out = shell(guide, line)
    listed = re.findall(r"^  (\w+)\s", out.split("shipped:")[0], re.M)  # the loaded plugins
    assert listed == ["count_fallbacks", "clamp_length", "fallback_length", "hint_length", "batch_is_long", "hrrn",
                      "defaults"]
    from lengths import CountFallbacks

    args = shlex.split(line)
    policy = args[args.index("--policy") + 1]
    stacked = [args[i + 1] for i, a in enumerate(args) if a == "--plugin" and "CountFallbacks" not in args[i + 1]]
    watcher = CountFallbacks()
    engine = Engine(EngineConfig(policy=policy, plugins=stacked), plugins=[watcher])
    ctx = engine.scheduler.ctx
    asked = ctx.hook.estimate_output_tokens
    answers = [
        asked(ctx=ctx, seq=Sequence("r", [1, 2], SamplingParams(), 0.0, tenant=tenant, expected_output_tokens=hint))
        for tenant, hint in (("chat", None), ("chat", 10), ("chat", 5000), ("batch", 10), ("batch", None))
    ]
    assert answers == [128, 10, 1024, 1024, 1024]
    assert watcher.fallbacks == 1


# --- the conformance suite -----------------------------------------------------------------------


def test_the_conformance_tests_of_the_guide_pass(guide):
    for line in (command("pytest", "acme-tenants/tests"), command("pytest", "test_research_conformance")):
        out = shell(guide, line, timeout=600)
        assert re.search(r"\b1 passed\b", out)


def test_strict_check_on_the_suites_tenants_alone_shows_the_tenant_code_never_ran(guide, on_path):
    (snippet,) = [b for lang, b in BLOCKS if lang == "python" and "suite's tenants\")" in b]
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(guide / "site"))  # acme_tenants installed (its entry point)
        exec(snippet, {})


def test_a_bad_victim_fails_the_suite_naming_plugin_and_hook(on_path):
    (snippet,) = [b for lang, b in BLOCKS if lang == "python" and "BadVictim\")" in b]
    exec(snippet, {})
    with pytest.raises(ConformanceError) as err:
        check_plugin("bad_victim:BadVictim")
    assert "is not a running sequence" in str(err.value)


# --- observers -----------------------------------------------------------------------------------


def test_the_recorder_prints_what_the_guide_shows(on_path):
    (snippet,) = [b for lang, b in BLOCKS if lang == "python" and "recorder = Recorder()" in b]
    printed = []
    namespace = {"print": lambda *a: printed.append(" ".join(map(str, a)))}
    exec(snippet, namespace)
    assert printed == text_block("'on_arrival'").strip().splitlines()
    engine, recorder = namespace["engine"], namespace["recorder"]
    # the forked sample was admitted without an arrival; the empty step 3 was counted and ended
    arrived = {i for _, hook, ids in recorder.events if hook == "on_arrival" for i in ids}
    admitted = {i for _, hook, ids in recorder.events if hook == "on_admitted" for i in ids}
    assert admitted - arrived == {"a#1"}
    assert [e for e in recorder.events if e[0] == 3] == [(3, "on_step_end", [])]
    engine.add_request(Request(request_id="c", prompt_token_ids=[5, 6], sampling=SamplingParams(max_new_tokens=1)))
    engine.step()
    assert (4, "on_arrival", ["c"]) in recorder.events


def test_each_victim_is_reported_once_and_before_the_admissions_of_its_step(on_path):
    from recorder import Recorder

    recorder = Recorder()
    spec = SyntheticSpec(num_requests=200, rate=100.0, prompt_len={"dist": "uniform", "low": 8, "high": 100},
                         output_len={"dist": "uniform", "low": 8, "high": 200}, priorities={0: 0.3, 2: 0.7}, seed=4)
    # priority preempts a running request for a more urgent waiting one, during admission
    config = EngineConfig(policy="priority", max_num_seqs=16, num_blocks=256, admit_after_preemption=True)
    doc = simulate(Workload("w", generate(spec), "", {}), config, [recorder])
    assert doc["summary"]["preemptions"] > 0
    victims = [(step, i) for step, hook, ids in recorder.events if hook == "on_preempted" for i in ids]
    assert len(victims) == len(set(victims)) == doc["summary"]["preemptions"]
    both = 0
    for step in {s for s, _ in victims}:
        hooks = [h for s, h, _ in recorder.events if s == step and h in ("on_preempted", "on_admitted")]
        if "on_admitted" in hooks:  # the victims are back in the queue before the admissions end
            both += 1
            assert hooks[0] == "on_preempted"
    assert both > 0
    per_step = Counter((step, hook) for step, hook, _ in recorder.events if hook not in ("on_preempted", "on_arrival"))
    assert max(per_step.values()) == 1  # the other observers: once a step (on_arrival: once a request)
    arrivals = [i for _, hook, ids in recorder.events if hook == "on_arrival" for i in ids]
    assert sorted(arrivals) == sorted(set(arrivals)) and len(arrivals) == 200  # each request once


# --- the API reference, and every block accounted for --------------------------------------------


def test_the_reference_build_command_is_the_one_ci_runs():
    assert command("sphinx-build") == "sphinx-build -W -b html docs docs/_build/html"
    assert command("pip install", "docs") == "pip install -e '.[docs]'"
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "docs" in _included_extras(extras["test"]) or (
        {r.split(">")[0] for r in extras["docs"]} <= {r.split(">")[0] for r in extras["test"]})


def test_the_tenant_affinity_router_passes_check_plugin_strict_on_its_cluster(guide):
    out = shell(guide, command("tenant_affinity:TenantAffinity"))
    assert re.search(r"chat +cluster .*routed=\{'r0': \d+, 'r1': \d+, 'r2': \d+\} \(down after a third: r1\)", out), out
    assert re.search(r"route: called \d+ times, changed the answer [1-9]\d* times", out), out


@pytest.mark.slow  # the suite three times (with and without the plugin): about a minute here
def test_the_edf_example_passes_its_own_test(guide):
    out = shell(guide, command("test_edf.py"), timeout=600)
    assert re.search(r"\b1 passed\b", out)


@pytest.mark.slow  # the whole suite, and the torch executor on a tiny model: about a minute here
def test_the_token_ban_passes_check_plugin_strict_on_real_logits(guide):
    pytest.importorskip("transformers")
    out = shell(guide, command("token_ban:TokenBan"))
    assert re.search(r"torch-tiny +sample", out)
    assert re.search(r"sample: called \d+ times, changed the answer [1-9]\d* times", out), out


SNIPPETS = {
    "python": ["recorder = Recorder()", "BadVictim\")", "suite's tenants\")"],
    "text": ["pyproject.toml", "dictionary changed size", "'on_arrival'"],
}
COMMANDS = [
    ("quiet_batch:QuietBatch",), ("token_ban:TokenBan",), ("tenant_affinity:TenantAffinity",), ("test_edf.py",), ("pip install -e ./acme-tenants",), ("plugins", "acme_tenants"),
    ("compare", "acme_tenants"), ("hrrn:HRRN", "compare"), ("las.json",), ("las-roofline.json",), ("lengths:",),
    ("pytest", "acme-tenants/tests"), ("pytest", "test_research_conformance"), ("sphinx-build",),
    ("pip install", "docs"),
]


def test_every_block_is_run():
    for lang, body in BLOCKS:
        if body.startswith("# file: "):
            continue
        if lang == "bash":
            continue
        claims = [k for k in SNIPPETS.get(lang, []) if k in body]
        assert len(claims) == 1, f"a {lang} block no test runs:\n{body}"
    for line in commands():
        claims = [c for c in COMMANDS if all(w in line for w in c)]
        assert len(claims) == 1, f"a command no test runs (or two claim): {line}"
    assert len(FILES) == len([b for _, b in BLOCKS if b.startswith("# file: ")])  # no path twice


@pytest.mark.slow
def test_the_package_really_installs(guide, tmp_path):
    """pip builds acme-tenants from the guide's pyproject.toml (setuptools, fetched by pip's build
    isolation) and installs it; `metroline plugins` then finds it by its entry point alone."""
    target = tmp_path / "installed"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
         str(guide / "acme-tenants")],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(target)}
    out = subprocess.run(
        [str(Path(sys.executable).parent / "metroline"), *shlex.split(command("plugins", "acme_tenants"))[1:]],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    ).stdout
    assert "entry points: acme_tenants (acme_tenants.plugin:AcmeTenants)" in out
    assert re.search(r"^  acme_tenants\s+admission", out, re.M)


def _included_extras(requirements: list[str]) -> set[str]:
    """The extras of metroline itself that a list of requirements pulls in (`metroline[a,b]`)."""
    return {e.strip() for r in requirements if r.startswith("metroline[") for e in r[len("metroline["):-1].split(",")}
