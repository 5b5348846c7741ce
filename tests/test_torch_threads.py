"""The torch executor's thread count: `--threads`, and a default that never exceeds the cores the
process may run on, shrinks on a busy machine and respects `OMP_NUM_THREADS` (no timing here:
the inputs are the affinity mask, the load average and the environment)."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch

from metroline.cli import main
from metroline.executors.torch import threads


@pytest.fixture(autouse=True)
def keep_torch_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_pinned_to_one_core_the_default_is_one_thread():
    """A process whose affinity is one core (what `taskset -c 0` gives) defaults to 1 thread, even
    without OMP_NUM_THREADS and on an idle machine."""
    core = min(os.sched_getaffinity(0))
    code = (f"import os; os.sched_setaffinity(0, {{{core}}}); "
            "from metroline.executors.torch import threads; "
            "print(threads.usable_cores(), threads.default_threads())")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "1"]


def test_the_default_is_the_usable_cores_less_the_busy_ones_and_at_most_omp(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5})
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.3, 0.0, 0.0))
    assert (threads.usable_cores(), threads.free_cores(), threads.default_threads()) == (6, 7, 6)
    monkeypatch.setattr(os, "getloadavg", lambda: (4.6, 0.0, 0.0))
    assert (threads.free_cores(), threads.default_threads()) == (3, 3)
    monkeypatch.setattr(os, "getloadavg", lambda: (10.0, 0.0, 0.0))  # busier than the machine: one thread
    assert (threads.free_cores(), threads.default_threads()) == (1, 1)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert threads.default_threads() == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "16")  # never past the usable cores
    assert threads.default_threads() == 6
    monkeypatch.setenv("OMP_NUM_THREADS", "junk")
    assert threads.default_threads() == 6


def test_an_explicit_count_is_checked_and_oversubscribing_warns(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    for bad in (0, -1, 4097, 1.5, True):
        with pytest.raises(ValueError, match=r"^--threads .*: an integer from 1 to 4096$"):
            threads.resolve(bad)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert threads.resolve(2) == 2
    with pytest.warns(RuntimeWarning, match="--threads 3: more than the 2 core"):
        assert threads.resolve(3) == 3
    assert threads.apply(1) == 1 and torch.get_num_threads() == 1


def test_generate_refuses_a_bad_thread_count_before_the_model_loads(tmp_path, capsys, monkeypatch):
    from metroline.executors.torch import loader

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(loader, "load", no_load)
    assert main(["generate", "--model", str(tmp_path / "absent"), "--threads", "0", "x"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        "metroline: error: --threads 0: an integer from 1 to 4096"


def test_run_with_the_simulator_refuses_threads(capsys):
    assert main(["run", "--workload", "chat", "--max-requests", "4", "--threads", "2"]) == 2
    assert "--threads applies to --executor torch, not sim" in capsys.readouterr().err


def test_the_executor_runs_with_the_threads_asked_and_reports_them(tmp_path, capsys):
    """`threads=1` (what `--threads 1` passes) on a tiny saved model: loading sets torch's thread count and the executor's
    description (the run manifest's) names it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from metroline.executors.torch import TorchExecutor

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    torch.set_num_threads(2)
    executor = TorchExecutor.from_options(model=str(tmp_path), device="cpu", threads=1)
    assert torch.get_num_threads() == 1
    assert executor.describe()["threads"] == 1
