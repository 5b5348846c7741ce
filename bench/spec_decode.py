"""Speculative decoding on a real model on this CPU: SmolLM2 with n-gram prompt lookup, where lookup
pays (the model is asked to copy-edit a given text, so its output repeats the prompt).

Each prompt is a paragraph and an instruction to write it out again with one change; greedy, EOS
on, `--max-new-tokens` at most. The same requests run without speculation and with
`{"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": 2, "prompt_lookup_max": 5}`
(after a warm-up run of each), one at a time (`--batch 1`) or all together, `--repeats` rounds
alternating the two (the order swapped each round, so drift in the machine's load hits both), each
run's load average printed beside it. Printed: output tokens per second of each run, the medians
and the speed-up of the medians, whether every output is identical token for token, and the
drafts' acceptance rate and mean acceptance length. The malloc settings of the documented torch
benchmarks (docs/guide/benchmarks.md) are applied (the script re-executes itself with them).

Run:  .venv/bin/python bench/spec_decode.py [--k 4] [--batch 1] [--max-new-tokens 96] [--threads 2] [--prompts N]
      [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

MALLOC_ENV = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "1000000000000",
              "MALLOC_TOP_PAD_": "536870912"}

TEXTS = [
    "The city council met on Tuesday evening to discuss the new bicycle lanes on Main Street. Several residents "
    "spoke in favour of the plan, saying that the lanes would make the street safer for children walking to school.",
    "Photosynthesis is the process by which green plants use sunlight to make food from carbon dioxide and water. "
    "The process takes place in the chloroplasts and releases oxygen into the air as a by-product.",
    "Our team released version two of the library last week. It adds support for streaming responses, fixes a "
    "memory leak in the connection pool, and removes the deprecated configuration options.",
    "The museum will be closed on Monday for maintenance. Visitors who bought tickets for that day can use them on "
    "any other day this month, or ask for a full refund at the front desk.",
]


def prompt(text: str) -> str:
    return (f"Rewrite the following text exactly as it is, but replace the word 'the' at its start with 'A'.\n\n"
            f"Text: {text}\n\nRewritten text:")


def run(executor, tokenizer, prompts, spec, max_new, batch):
    from metroline.core.config import EngineConfig
    from metroline.core.step.engine import Engine

    engine = Engine(EngineConfig(max_num_seqs=batch, num_blocks=512, speculative_config=spec), executor)
    start = time.perf_counter()
    for i, p in enumerate(prompts):
        text = tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
        ids = tokenizer.encode(text, add_special_tokens=False)
        engine.add_request({"request_id": f"p{i}", "prompt_token_ids": list(ids),
                            "sampling": {"max_new_tokens": max_new, "temperature": 0.0}})
    engine.run()
    wall = time.perf_counter() - start
    outputs = [engine.sequences(f"p{i}")[0].output_token_ids for i in range(len(prompts))]
    counters = engine.scheduler.speculation.counters.as_dict() if engine.scheduler.speculation else None
    return wall, outputs, counters


def main() -> None:
    if any(os.environ.get(k) != v for k, v in MALLOC_ENV.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **MALLOC_ENV})
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3, help="rounds of (without, with) speculation; medians printed")
    p.add_argument("--prompts", type=int, default=len(TEXTS), help="how many of the texts (default all)")
    args = p.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    from metroline.executors.torch import TorchExecutor

    executor = TorchExecutor.from_options(model="smollm2", dtype="float32", device="cpu")
    tokenizer = executor.tokenizer
    prompts = [prompt(t) for t in TEXTS[: args.prompts]]
    spec = {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    run(executor, tokenizer, prompts[:1], None, 8, 1)  # warm-up
    run(executor, tokenizer, prompts[:1], spec, 8, 1)
    print(f"SmolLM2-135M, CPU float32, {args.threads} threads, {len(prompts)} copy-edit prompts, batch {args.batch}, "
          f"greedy, <= {args.max_new_tokens} new tokens; n-gram k={args.k}, lookup 2..5; {args.repeats} rounds, "
          f"without and with speculation alternating (the order swapped each round)", flush=True)
    rates = {"plain": [], "spec": []}
    plain = spec_out = c = None
    for r in range(args.repeats):
        for kind in (("plain", "spec") if r % 2 == 0 else ("spec", "plain")):
            load = os.getloadavg()[0]
            wall, out, counters = run(executor, tokenizer, prompts, None if kind == "plain" else spec,
                                      args.max_new_tokens, args.batch)
            tokens = sum(map(len, out))
            rates[kind].append(tokens / wall)
            if kind == "plain":
                plain = out
            else:
                spec_out, c = out, counters
                if plain is not None and out != plain:
                    print("  OUTPUTS DIFFER")
            print(f"  round {r + 1} {'without' if kind == 'plain' else 'with n-gram':<11} {tokens} tokens in "
                  f"{wall:6.2f} s = {tokens / wall:6.1f} tok/s   (load average {load:.2f} at its start)", flush=True)
    med_plain, med_spec = statistics.median(rates["plain"]), statistics.median(rates["spec"])
    pairs = [s / p for p, s in zip(rates["plain"], rates["spec"])]
    print(f"  median without speculation {med_plain:.1f} tok/s, with n-gram {med_spec:.1f} tok/s: speed-up "
          f"{med_spec / med_plain:.2f}x (per round: {', '.join(f'{x:.2f}x' for x in pairs)})")
    print(f"  outputs identical: {spec_out == plain}; acceptance rate "
          f"{c['acceptance_rate']:.1%}, mean acceptance length {c['mean_acceptance_length']:.2f}, "
          f"tokens per request-step {c['tokens_per_request_step']:.2f}")
    print(f"  first output: {tokenizer.decode(plain[0])!r}")


if __name__ == "__main__":
    main()
