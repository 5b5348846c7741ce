"""Shared helpers for the engine-level tests: small engines, requests, and an executor that records
what every step plan asked for; and the `slow` marker.

Slow tests (`@pytest.mark.slow`, or listed in `SLOW_TESTS` below) are skipped by a plain `pytest`
and run with `pytest --runslow` (what `.ci/run` does) or selected with `pytest -m slow`. Without
`--runslow` the progress fuzz (`test_progress.py`) also runs `FAST_PROGRESS_EXAMPLES` examples
instead of 1000, unless `PROGRESS_EXAMPLES` is set."""

from __future__ import annotations

import collections
import os
import platform
import zlib
from typing import Any

import pytest


def torch_threads() -> int:
    """torch's intra-op threads in the tests: `OMP_NUM_THREADS` when it is set (how a run with
    another thread count is asked for), else 1 (the test machines are small and shared: threads
    spinning against other processes make tiny ops 20x slower). `pytest_configure` sets it."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    if not value:
        return 1
    try:
        return max(1, int(value.split(",")[0]))
    except ValueError:
        raise pytest.UsageError(f"OMP_NUM_THREADS={value!r}: expected a number of threads") from None


# The torch executor picks its linear kernel by row count from a crossover it times on the machine
# (`executors/torch/linear.py`): in the tests the kernels must not depend on the host or its load,
# so every call takes oneDNN's packed kernel, as before the row-count choice (tests/test_torch_linear.py
# covers both sides of a crossover and its measurement, with this unset there).
os.environ.setdefault("METROLINE_LINEAR_MIN_ROWS", "1")

if os.environ.get("PYTEST_XDIST_WORKER"):  # `pytest -n N`: N processes share the cores, one torch thread each
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        import torch
    except ImportError:
        pass
    else:
        torch.set_num_threads(torch_threads())

from metroline.core.config import EngineConfig
from metroline.core.step.engine import Engine
from metroline.core.step.plan import StepPlan, StepResult
from metroline.executors.cost_models import make_cost_model
from metroline.executors.simulated import SimulatedExecutor

STEP = 0.01
"""Seconds per step of the `steps` cost model the helpers use (its default)."""


def tokens(tag: int, n: int) -> list[int]:
    """`n` prompt tokens unique to `tag` (no prefix is shared between different tags, n < 100000)."""
    return [tag * 100_000 + i + 1 for i in range(n)]


def request(rid: str, prompt: int | list[int], max_new: int = 4, **kw: Any) -> dict[str, Any]:
    """A request dict: `prompt` is a token list or a length (then tokens unique to the id);
    `kw` goes to the sampling params, except `tenant`, `priority`, `arrival_time`, `cache_salt`."""
    if isinstance(prompt, int):
        prompt = tokens(zlib.crc32(rid.encode()) + 1, prompt)
    top = {k: kw.pop(k) for k in ("tenant", "priority", "arrival_time", "cache_salt") if k in kw}
    return {
        "request_id": rid,
        "prompt_token_ids": list(prompt),
        "sampling": {"max_new_tokens": max_new, **kw},
        **top,
    }


class PlanRecord:
    """A snapshot of one executed plan, taken before the scheduler advanced the sequences."""

    def __init__(self, plan: StepPlan) -> None:
        self.step = plan.step
        self.scheduled = {s.seq_id: n for s, n in plan.scheduled.items()}
        self.starts = {s.seq_id: s.num_computed_tokens for s in plan.scheduled}
        self.block_ops = list(plan.block_ops)
        self.admitted = [s.seq_id for s in plan.admitted]
        self.preempted = [(s.seq_id, s.state.name) for s in plan.preempted]
        self.num_prefill_tokens = plan.num_prefill_tokens
        self.num_decode_tokens = plan.num_decode_tokens
        self.num_context_tokens = plan.num_context_tokens
        self.sample = [s.seq_id for s in plan.sample_seqs]

    def __repr__(self) -> str:
        return f"PlanRecord(step={self.step}, scheduled={self.scheduled}, ops={self.block_ops})"


class RecordingExecutor(SimulatedExecutor):
    """The simulated executor (`steps` cost model, 0.01 s a step) that keeps a `PlanRecord` of
    every plan it runs in `plans`, and calls `on_execute(plan)` first when given (which may raise
    to simulate a failing step)."""

    def __init__(self, on_execute: Any = None) -> None:
        super().__init__(make_cost_model("steps", step_time=STEP))
        self.plans: list[PlanRecord] = []
        self.on_execute = on_execute

    def execute(self, plan: StepPlan) -> StepResult:
        self.plans.append(PlanRecord(plan))
        if self.on_execute is not None:
            self.on_execute(plan)
        return super().execute(plan)


def make_engine(
    *, plugins: Any = (), specs: Any = (), eos_token_id: int | None = None, executor: Any = None, **config: Any
) -> Engine:
    """An engine on a `RecordingExecutor` (small defaults: block_size 4, 64 blocks).

    `plugins`: plugin objects stacked on top; `specs`: plugin specs for `EngineConfig.plugins`;
    `config`: the other `EngineConfig` fields."""
    fields = {"block_size": 4, "num_blocks": 64, "max_num_seqs": 8, "max_num_batched_tokens": 64}
    fields.update(config, plugins=list(specs))
    return Engine(
        EngineConfig(**fields), executor or RecordingExecutor(), plugins=plugins, eos_token_id=eos_token_id
    )


def live_tables(engine: Engine) -> list[list[int]]:
    """The block tables of every sequence that holds device blocks."""
    s = engine.scheduler
    return [q.block_table for q in (*s.running, *s.waiting, *s.swapped) if q.block_table]


def run_to_end(engine: Engine, max_steps: int = 100_000) -> int:
    """Step until nothing is left, checking the pool invariants after every step; returns the
    number of steps."""
    n = 0
    while engine.has_unfinished():
        engine.step()
        engine.pool.check_invariants(live_tables(engine))
        n += 1
        assert n < max_steps, "the engine does not finish"
    return n


def assert_pool_drained(engine: Engine) -> None:
    """After every request ended: nothing referenced, every block free or evictable."""
    pool = engine.pool
    pool.check_invariants([])
    assert pool.num_used_blocks() == 0
    assert pool.num_free_blocks() == pool.num_blocks
    swap = engine.scheduler.swap
    if swap is not None:
        assert swap.num_free_blocks() == swap.num_blocks


# --- the slow marker -------------------------------------------------------------------------------

SLOW_TESTS = {
    # real SmolLM2 weights: parity with Hugging Face generate (about 30 s)
    ("test_torch_executor.py", "test_smollm2_chat_prompts_match_hf_generate"),
    # the SmolLM2 tokenizer: dequantizes the GGUF file into the loader's cache when no other test did
    ("test_sampling_detokenizer.py", "test_streamed_text_is_the_full_decode"),
    ("test_sampling_detokenizer.py", "test_stop_strings_cut_where_the_full_decode_says"),
    # long runs: a weighted-fair run through HTTP, two azure_conv demonstrations (10-13 s each)
    ("test_serve.py", "test_weighted_fair_one_to_two_holds_through_http_in_every_window"),
    ("test_policy_srpt.py", "test_srpt_with_oracle_lengths_halves_fcfs_mean_e2e_on_azure_conv"),
    ("test_preemption_order.py", "test_azure_conversation_preemptions_stay_within_1_2x_of_vllm"),
}
"""(file name, test function) of the slow tests that their own file does not mark."""

FAST_PROGRESS_EXAMPLES = 100
"""Examples of the progress fuzz in a run without `--runslow` (1000 with it, about 35 s)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", default=False,
                     help="also run the tests marked slow (real-model parity, long runs, the full progress fuzz)")


LONGEST_FILES = (
    "test_deterministic_smollm2.py", "test_multiplicity.py", "test_canary_trials.py", "test_plugin_guide.py",
    "test_deterministic.py", "test_deterministic_cli.py", "test_ab_trials.py", "test_serve_replicas.py",
    "test_progress.py", "test_generate_cli.py", "test_torch_executor.py",
)
"""The test files that take longest under `--runslow` (from `--durations`), longest first. Under
`pytest -n 2 --dist loadfile` each worker takes the next whole file when it runs short, in the
collection's order: these go first, the others after them, most tests first. (xdist's own order,
most tests first, which `pytest_configure` turns off, put these files of few tests last: one
worker then ran the SmolLM2 file alone for minutes at the end.)"""


def cpu_description() -> list[str]:
    """What the suite's numbers depend on, for its header: the CPU's model and the vector ISA
    features it offers, torch's CPU capability (the ATen kernels' ISA level) and oneDNN's limit
    (`ONEDNN_MAX_CPU_ISA`, `ATEN_CPU_CAPABILITY` when set), and the torch threads the tests use."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model == (platform.processor() or platform.machine()):
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    wanted = ("sse4_1", "avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")
    lines = [f"cpu: {model} ({platform.machine()}, {os.cpu_count()} CPUs)"
             + (f"; ISA features: {' '.join(f for f in wanted if f in flags) or 'none listed'}" if flags else "")]
    limits = [f"{name}={os.environ[name]}" for name in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")
              if name in os.environ]
    try:
        import torch
    except ImportError:
        lines.append("torch: not installed")
    else:
        lines.append(f"torch {torch.__version__}: CPU capability {torch.backends.cpu.get_cpu_capability()}, "
                     f"{'; '.join(limits) or 'ONEDNN_MAX_CPU_ISA unset (the CPU best)'}, "
                     f"{torch_threads()} thread(s) in the tests (OMP_NUM_THREADS="
                     f"{os.environ.get('OMP_NUM_THREADS', 'unset')})")
    return lines


def pytest_report_header(config: pytest.Config) -> list[str]:
    return cpu_description()


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """The project's `-q` (pyproject's addopts) hides pytest's header, and `pytest_report_header`
    with it: print the CPU lines anyway (once, not in xdist's workers), unless `--no-header`."""
    config = session.config
    if hasattr(config, "workerinput") or config.option.no_header or config.get_verbosity() >= 0:
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        for line in cpu_description():
            reporter.write_line(line)


def pytest_configure(config: pytest.Config) -> None:
    try:
        import torch
    except ImportError:
        pass
    else:  # every test file the same threads, whether or not it imports the torch helpers
        torch.set_num_threads(torch_threads())
    if not config.getoption("--runslow"):
        os.environ.setdefault("PROGRESS_EXAMPLES", str(FAST_PROGRESS_EXAMPLES))
    if getattr(config.option, "loadscopereorder", False):  # pytest-xdist: keep the order given below
        config.option.loadscopereorder = False


def longest_first(items: list[pytest.Item]) -> None:
    """Order `items` file by file: `LONGEST_FILES` in their order, then the other files, most
    tests first (ties in collection order); each file's own order is kept."""
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    count = collections.Counter(item.path for item in items)
    items.sort(key=lambda item: (rank.get(item.path.name, len(rank)), -count[item.path]))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    longest_first(items)
    for item in items:
        if (item.path.name, getattr(item, "originalname", item.name)) in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
    if config.getoption("--runslow") or "slow" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow or -m slow")
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(skip)
