"""metroline's real executor against Hugging Face transformers on the same model and workload:
output tokens per second of metroline (fcfs, torch executor), transformers' continuous batching
(`init_continuous_batching`) and HF static `generate` in left-padded batches.

Workloads (64 requests, greedy, EOS off, random prompts of `--prompt-len` tokens from one seed):
- `mixed`: 54 requests of 16 output tokens and 10 of 160 (HF's `generate_batch` takes one
  `max_new_tokens` for all, so continuous batching is driven request by request:
  `init_continuous_batching` + `start` + `add_request(..., max_new_tokens=n)` + `get_result` +
  `stop`, with explicit `num_blocks` and `max_batch_tokens`). Static batches run to their longest
  request; only the requested tokens count.
- `uniform`: 64 requests of 64 output tokens.
- `single`: batch 1, the case a chat user meets: the copy-edit prompts of `bench/spec_decode.py`
  (SmolLM2's chat template, EOS on, up to `--single-max-new` tokens), one request at a time, on
  metroline plain (`metroline`) and with n-gram speculation (`metroline_ngram`: k = 4, lookup
  1..2) against HF greedy `generate` (`hf_generate`) and HF prompt lookup decoding
  (`hf_lookup`: `prompt_lookup_num_tokens=4`, its default n-gram sizes 2..1). metroline runs one
  engine, each request submitted when the one before has finished. `--rounds` rounds, the engines'
  order reversed every other round; printed per round and as medians of tokens per CPU second, and
  whether all four produced the same token ids for every prompt (greedy: they must).

Each engine first runs a short warm-up (not timed). Besides wall-clock seconds, the table gives
the process's CPU seconds over the same interval (all threads): on a machine shared with other work
they show what each engine costs when the wall clock mostly shows the neighbours. Token counts are
checked: every engine must produce exactly the requested tokens. Torch timings on a small machine are only stable with the
allocator settings in `MALLOC_ENV`; the script re-executes itself with them when they are missing.

metroline's executor runs its float32 linear layers through oneDNN on prepacked weights
(`executors/torch/linear.py`); HF runs torch's stock `linear` (MKL). `--hf-linear onednn` gives
both HF engines the same linear layers, to separate what the kernels win from what the engine wins.

Run:  python bench/vs_hf.py [--model smollm2] [--workloads mixed,uniform] [--threads N] [--hf-linear onednn]
      python bench/vs_hf.py --workloads single [--rounds 3] [--single-max-new 64]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import sys
import time
from typing import Any

from metroline.core.plugins.hookspecs import hookimpl

MALLOC_ENV = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "1000000000000",
              "MALLOC_TOP_PAD_": "536870912"}

WORKLOADS = {"mixed": [16] * 54 + [160] * 10, "uniform": [64] * 64}
"""Output lengths of each workload's requests, in submission order (long ones last)."""


class Stopwatch:
    """Wall-clock seconds and the process's CPU seconds (all threads) since it was made."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def read(self) -> tuple[float, float]:
        return time.perf_counter() - self.wall, time.process_time() - self.cpu


def prompts_for(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab) for _ in range(length)] for _ in range(n)]


def run_metroline(executor: Any, prompts: list[list[int]], lengths: list[int]) -> tuple[float, float, int]:
    """(seconds, CPU seconds, output tokens) of one engine run, fcfs, all requests submitted at once."""
    from metroline.core.config import EngineConfig
    from metroline.core.step.engine import Engine

    plugins = [] if _vectorised_sampler() else [_Argmax()]
    engine = Engine(EngineConfig(policy="fcfs", num_blocks=executor.suggest_num_blocks(16)), executor,
                    plugins=plugins)
    clock = Stopwatch()
    for i, (p, n) in enumerate(zip(prompts, lengths)):
        engine.add_request({"request_id": str(i), "prompt_token_ids": p,
                            "sampling": {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True}})
    done = engine.run()
    dt, cpu = clock.read()
    tokens = sum(len(seqs[0].output_token_ids) for seqs in done.values())
    return dt, cpu, tokens


def _vectorised_sampler() -> bool:
    import importlib.util

    return importlib.util.find_spec("metroline.executors.torch.sampling") is not None


class _Argmax:
    """Greedy on the logits tensor, used when the default sampler has no tensor path."""

    name = "argmax"

    @hookimpl
    def sample(self, seqs: list, logits: Any) -> list[int]:
        return logits.argmax(dim=-1).tolist()


def run_hf_continuous(
    model: Any, prompts: list[list[int]], lengths: list[int], linear_layers: Any, block_size: int = 32
) -> tuple[float, float, int]:
    """transformers' continuous batching, each request with its own `max_new_tokens`, with the
    linear layers `linear_layers()` (a context manager) selects."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    need = sum(-(-(len(p) + n) // block_size) for p, n in zip(prompts, lengths))
    cb = ContinuousBatchingConfig(num_blocks=need + 64, max_batch_tokens=2048, page_size=block_size)
    gen = GenerationConfig(do_sample=False, max_new_tokens=max(lengths), eos_token_id=None, pad_token_id=0)
    with linear_layers():
        manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cb)
        manager.start()
        try:
            clock = Stopwatch()
            for i, (p, n) in enumerate(zip(prompts, lengths)):
                manager.add_request(p, request_id=f"r{i}", max_new_tokens=n)
            tokens, done = 0, 0
            while done < len(prompts):
                result = manager.get_result(timeout=600)
                if result is None:
                    raise RuntimeError("HF continuous batching stopped before every request finished")
                if result.is_finished():
                    if result.error:
                        raise RuntimeError(f"HF continuous batching: {result.request_id}: {result.error}")
                    done += 1
                    tokens += len(result.generated_tokens)
            dt, cpu = clock.read()
        finally:
            manager.stop(block=True)
    return dt, cpu, tokens


def run_hf_static(
    model: Any, prompts: list[list[int]], lengths: list[int], batch: int, linear_layers: Any
) -> tuple[float, float, int]:
    """HF `generate` on left-padded batches of `batch` requests (a batch runs to its longest
    request), with the linear layers `linear_layers()` (a context manager) selects."""
    import torch

    tokens = 0
    clock = Stopwatch()
    for b in range(0, len(prompts), batch):
        ps, ns = prompts[b:b + batch], lengths[b:b + batch]
        width = max(map(len, ps))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in ps])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ps])
        with torch.inference_mode(), linear_layers():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=max(ns), min_new_tokens=max(ns),
                                 do_sample=False, pad_token_id=0, eos_token_id=None)
        tokens += sum(min(n, out.shape[1] - width) for n in ns)
    return (*clock.read(), tokens)


SINGLE_ENGINES = ("metroline", "hf_generate", "metroline_ngram", "hf_lookup")
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 2}
"""metroline's n-gram speculation in the `single` workload: HF prompt lookup's k and n-gram sizes."""


def single_prompts(tokenizer: Any) -> list[list[int]]:
    """The copy-edit prompts of `bench/spec_decode.py` in the model's chat template, as token ids."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from spec_decode import TEXTS, prompt

    out = []
    for text in TEXTS:
        chat = tokenizer.apply_chat_template([{"role": "user", "content": prompt(text)}], add_generation_prompt=True,
                                             tokenize=False)
        out.append(tokenizer.encode(chat, add_special_tokens=False))
    return out


def run_metroline_single(executor: Any, prompts: list[list[int]], max_new: int, spec: dict | None) -> list[list[int]]:
    """metroline at batch 1: one engine, each prompt submitted when the one before finished."""
    from metroline.core.config import EngineConfig
    from metroline.core.step.engine import Engine

    engine = Engine(EngineConfig(policy="fcfs", num_blocks=256, speculative_config=spec), executor)
    outputs = []
    for i, p in enumerate(prompts):
        engine.add_request({"request_id": str(i), "prompt_token_ids": p,
                            "sampling": {"max_new_tokens": max_new, "temperature": 0.0}})
        engine.run()
        outputs.append(list(engine.sequences(str(i))[0].output_token_ids))
    return outputs


def run_hf_single(model: Any, prompts: list[list[int]], max_new: int, lookup: int | None) -> list[list[int]]:
    """HF `generate` at batch 1, greedy, with prompt lookup decoding of `lookup` tokens (None: off)."""
    import torch

    extra = {} if lookup is None else {"prompt_lookup_num_tokens": lookup}
    outputs = []
    for p in prompts:
        ids = torch.tensor([p])
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, do_sample=False,
                                 **extra)
        outputs.append(out[0, len(p):].tolist())
    return outputs


def main_single(args: argparse.Namespace, executor: Any, hf: Any) -> int:
    """The `single` workload (see the module docstring)."""
    import statistics

    prompts = single_prompts(executor.tokenizer)
    runners = {
        "metroline": lambda ps: run_metroline_single(executor, ps, args.single_max_new, None),
        "metroline_ngram": lambda ps: run_metroline_single(executor, ps, args.single_max_new, NGRAM),
        "hf_generate": lambda ps: run_hf_single(hf, ps, args.single_max_new, None),
        "hf_lookup": lambda ps: run_hf_single(hf, ps, args.single_max_new, 4),
    }
    for e in SINGLE_ENGINES:  # warm-up, not timed
        runners[e](prompts[:1])
    print(f"single: {len(prompts)} copy-edit prompts ({min(map(len, prompts))}..{max(map(len, prompts))} tokens), "
          f"batch 1, greedy, EOS on, <= {args.single_max_new} new tokens; {args.rounds} rounds")
    rates: dict[str, list[float]] = {e: [] for e in SINGLE_ENGINES}
    outputs: dict[str, list[list[int]]] = {}
    for r in range(args.rounds):
        order = SINGLE_ENGINES if r % 2 == 0 else SINGLE_ENGINES[::-1]
        for e in order:
            clock = Stopwatch()
            out = runners[e](prompts)
            dt, cpu = clock.read()
            tokens = sum(map(len, out))
            if e in outputs and outputs[e] != out:
                raise RuntimeError(f"{e}: round {r + 1} gave other tokens than round 1")
            outputs[e] = out
            rates[e].append(tokens / cpu)
            print(f"  round {r + 1} {e:<16} {tokens:>5} tokens  {dt:7.1f} s  {cpu:6.2f} cpu s  "
                  f"{tokens / cpu:6.1f} tok/cpu s  (load average {os.getloadavg()[0]:.1f})", flush=True)
    med = {e: statistics.median(v) for e, v in rates.items()}
    print("medians, tok/cpu s: " + ", ".join(f"{e} {med[e]:.1f}" for e in SINGLE_ENGINES))
    print(f"metroline / hf_generate = {med['metroline'] / med['hf_generate']:.2f}x; "
          f"metroline_ngram / hf_lookup = {med['metroline_ngram'] / med['hf_lookup']:.2f}x")
    same = all(outputs[e] == outputs["hf_generate"] for e in SINGLE_ENGINES)
    print(f"token ids identical across the four engines on every prompt: {same}")
    return 0 if same else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", help="a model folder, a .gguf or smollm2 (default)")
    parser.add_argument("--workloads", default="mixed,uniform")
    parser.add_argument("--engines", default="metroline,hf_cb,hf_static")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--static-batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads, every engine alike (default 1: on a shared machine more threads "
                        "spin against other processes)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=3, help="single: rounds of the four engines (default 3)")
    parser.add_argument("--single-max-new", type=int, default=64, help="single: most new tokens (default 64)")
    parser.add_argument("--hf-linear", choices=("torch", "onednn"), default="torch",
                        help="HF's linear layers: torch's stock kernel (default) or metroline's oneDNN ones")
    args = parser.parse_args()
    if any(os.environ.get(k) != v for k, v in MALLOC_ENV.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **MALLOC_ENV})

    import torch
    from transformers import AutoModelForCausalLM

    from metroline.executors.torch import TorchExecutor, linear
    from metroline.executors.torch.attention import register
    from metroline.executors.torch.loader import load

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer, folder = load(args.model, torch.float32, torch.device("cpu"), register())
    executor = TorchExecutor(model, tokenizer, source=args.model)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    hf_linear = contextlib.nullcontext
    if args.hf_linear == "onednn":
        if not linear.install(hf):
            raise SystemExit("--hf-linear onednn: oneDNN linear layers are not available here")
        hf_linear = linear.active
    if args.workloads == "single":
        print(f"model {args.model} (float32, cpu, {torch.get_num_threads()} torch threads); load average "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; metroline's linear layers: oneDNN from "
              f"{linear.min_rows()} rows, torch's kernel below; HF {args.hf_linear}")
        return main_single(args, executor, hf)
    vocab = executor.vocab_size
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    print(f"model {args.model} (float32, cpu, {torch.get_num_threads()} torch threads); load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; prompts of {args.prompt_len} random tokens; greedy, EOS off; "
          f"linear layers: metroline {executor.describe()['linear']}, HF {args.hf_linear}")
    warm = prompts_for(4, 8, vocab, 99)
    runners = {
        "metroline": lambda ps, ns: run_metroline(executor, ps, ns),
        "hf_cb": lambda ps, ns: run_hf_continuous(hf, ps, ns, hf_linear),
        "hf_static": lambda ps, ns: run_hf_static(hf, ps, ns, args.static_batch, hf_linear),
    }
    for e in engines:
        runners[e](warm, [4] * 4)
    print(f"{'workload':<9} {'engine':<10} {'tokens':>7} {'seconds':>8} {'tok/s':>7} {'cpu s':>7} {'tok/cpu s':>9}")
    for name in [w.strip() for w in args.workloads.split(",") if w.strip()]:
        lengths = WORKLOADS[name]
        prompts = prompts_for(len(lengths), args.prompt_len, vocab, args.seed)
        rates, cpu_rates = {}, {}
        for e in engines:
            dt, cpu, tokens = runners[e](prompts, lengths)
            if tokens != sum(lengths):
                raise RuntimeError(f"{e} on {name}: {tokens} output tokens, expected {sum(lengths)}")
            rates[e], cpu_rates[e] = tokens / dt, tokens / cpu
            print(f"{name:<9} {e:<10} {tokens:>7} {dt:>8.1f} {rates[e]:>7.1f} {cpu:>7.1f} {tokens / cpu:>9.1f}", flush=True)
        if "metroline" in rates and len(rates) > 1:
            others = ", ".join(f"{rates['metroline'] / rates[e]:.2f}x {e} (per CPU second "
                               f"{cpu_rates['metroline'] / cpu_rates[e]:.2f}x)" for e in rates if e != "metroline")
            print(f"{name:<9} metroline = {others}")
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
