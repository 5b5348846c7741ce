"""A structured-output grammar compiled off the step: how long a concurrent plain stream waits
between two tokens while a big schema's grammar compiles, against its own baseline.

An engine on a random tiny Llama (the torch executor, on the CPU) over a byte-level BPE
tokenizer (the tests' `sampling_models.bpe_tokenizer`) serves a plain greedy request of `--tokens`
tokens; the inter-token gaps are the wall time between its tokens, measured twice:

- baseline: alone;
- with a structured request whose schema is an `anyOf` of `--branches` objects (within the
  server's schema limits, `metroline.core.serving.schema_limits`) submitted after a few tokens:
  its grammar compiles in `GrammarCompiler`'s thread while the request waits outside the batch.

Also printed: how long that compile took in its thread (`compile_s`, at the compile threads' lower
CPU priority: what a step that built the matcher itself, as before this change, would have
stalled for, or a part of it at normal priority), and when the structured request got its first
token after the compile's end.

Run:  python bench/grammar_off_step.py [--tokens 200] [--branches 128]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import torch  # noqa: E402
from sampling_models import bpe_tokenizer  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from metroline.core.config import EngineConfig  # noqa: E402
from metroline.core.requests.request import Request, SamplingParams, StructuredOutput  # noqa: E402
from metroline.core.step.engine import Engine  # noqa: E402
from metroline.executors.torch import TorchExecutor  # noqa: E402
from metroline.plugins_contrib.structured_output import StructuredOutputSampler  # noqa: E402


def big_schema(branches: int) -> dict:
    def obj(i: int) -> dict:
        props = {f"k{i}_{j}": {"type": "string", "maxLength": 8 + j} for j in range(6)}
        return {"type": "object", "properties": props, "required": [f"k{i}_0"], "additionalProperties": False}
    return {"type": "object", "properties": {f"f{a}": {"anyOf": [obj(a * 1000 + i) for i in range(branches)]}
                                             for a in range(4)}, "required": ["f0"]}


def engine() -> tuple[Engine, StructuredOutputSampler]:
    tok = bpe_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         bos_token_id=None, eos_token_id=0, pad_token_id=None)
    config._attn_implementation = "eager"
    executor = TorchExecutor(LlamaForCausalLM(config).eval(), tok)
    plugin = StructuredOutputSampler(executor.tokenizer, executor.vocab_size, executor.eos_token_id)
    eng = Engine(EngineConfig(num_blocks=256, block_size=16, max_num_seqs=8), executor, plugins=[plugin])
    plugin.unavailable()  # llguidance's view of the tokenizer, built once, before measuring
    return eng, plugin


def gaps(tokens: int, schema: dict | None, tag: str) -> dict:
    eng, plugin = engine()
    eng.add_request(Request(request_id="plain", prompt_token_ids=[5, 6, 7],
                            sampling=SamplingParams(max_new_tokens=tokens, temperature=0, ignore_eos=True)))
    plain = eng.sequences("plain")[0]
    times: list[float] = []
    first_structured = compile_end = compile_s = None
    while eng.has_unfinished():
        eng.step()
        now = time.perf_counter()
        if len(times) < plain.num_output_tokens:
            times.append(now)
        if schema is not None and plain.num_output_tokens == 10 and "big" not in eng._requests:
            spec = StructuredOutput(json_schema=json.dumps({**schema, "title": tag}))  # a fresh compile
            eng.add_request(Request(request_id="big", prompt_token_ids=[8, 9],
                                    sampling=SamplingParams(max_new_tokens=64, structured_output=spec)))
            future, started = plugin.compile(spec), time.perf_counter()
        if schema is not None and "big" in eng._requests:
            if compile_end is None and future.done():
                compile_end, compile_s = time.perf_counter(), time.perf_counter() - started
            if first_structured is None and eng.sequences("big")[0].num_output_tokens:
                first_structured = now
    d = [b - a for a, b in zip(times, times[1:])]
    d.sort()
    out = {"max_gap_ms": 1e3 * d[-1], "p99_gap_ms": 1e3 * d[int(0.99 * (len(d) - 1))],
           "median_gap_ms": 1e3 * d[len(d) // 2]}
    if schema is not None:
        out["compile_s"] = compile_s
        late = None if first_structured is None else first_structured - compile_end
        out["first_token_after_compile_ms"] = None if late is None else 1e3 * late
        out["structured"] = eng.sequences("big")[0].finish_reason.value
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--branches", type=int, default=128)
    args = ap.parse_args()
    torch.set_num_threads(1)
    schema = big_schema(args.branches)
    print(f"schema: {len(json.dumps(schema))} bytes, 4 anyOf of {args.branches} objects")
    base = gaps(args.tokens, None, "")
    load = gaps(args.tokens, schema, str(time.time()))
    for name, r in (("baseline", base), ("with the big schema", load)):
        print(f"{name:>20}: " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items()))
    ratio = load["max_gap_ms"] / base["max_gap_ms"]
    print(f"max gap ratio {ratio:.2f}x (goal: under 2x); the compile took {load['compile_s']:.2f} s in its "
          f"thread (lower CPU priority), time a step building the matcher itself would have stalled "
          f"(a similar share of it at normal priority)")


if __name__ == "__main__":
    main()
