"""Triton paged attention vs torch on the same paged batch (CUDA only).

For each case: the Triton kernels (`paged_attention`), a torch baseline that gathers each
sequence's K/V through its block table and runs `scaled_dot_product_attention` per sequence, and,
when the branch has it, the torch executor's reference (`reference_attention.paged_attention`).
Also `write_kv` (Triton) against `index_copy_` on the flattened caches. Median of CUDA-event timed
repetitions after warm-up; the max abs difference to the torch baseline is printed beside.

Shapes: SmolLM2-135M (9 query heads, 3 KV heads, head dim 64) and a Llama-3-8B layer (32/8, 128),
block size 16, bfloat16 (`--dtype`).

Run:  python bench/attention_kernels.py [--dtype bfloat16] [--reps 50]
Without CUDA it says so and exits 0.
"""

from __future__ import annotations

import argparse
import importlib
import random
import statistics
import sys

import torch

MODELS = {"smollm2-135m": (9, 3, 64), "llama3-8b": (32, 8, 128)}
CASES = {  # name: [(context after the step, new tokens), ...]
    "decode 64 x 512": [(512, 1)] * 64,
    "decode 64 x 2048": [(2048, 1)] * 64,
    "decode 4 x 8192": [(8192, 1)] * 4,
    "prefill 4 x 512 new over 256": [(768, 512)] * 4,
    "mixed 512 prefill + 63 decodes x 1024": [(512, 512)] + [(1024, 1)] * 63,
}


def build(seqs, heads, kv_heads, head_dim, block_size, dtype, device):
    rng = random.Random(0)
    need = [-(-s // block_size) for s, _ in seqs]
    ids = list(range(sum(need)))
    rng.shuffle(ids)
    tables, at = [], 0
    for n in need:
        tables.append(ids[at:at + n] + [0] * (max(need) - n))
        at += n
    shape = (sum(need), block_size, kv_heads, head_dim)
    qsl = [0]
    for _, q_len in seqs:
        qsl.append(qsl[-1] + q_len)
    return dict(
        q=torch.randn(qsl[-1], heads, head_dim, device=device, dtype=dtype),
        k_cache=torch.randn(shape, device=device, dtype=dtype),
        v_cache=torch.randn(shape, device=device, dtype=dtype),
        block_tables=torch.tensor(tables, dtype=torch.int32, device=device),
        seq_lens=torch.tensor([s for s, _ in seqs], dtype=torch.int32, device=device),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
        scale=head_dim ** -0.5,
    )


def torch_sdpa(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale):
    """Gather each sequence's K/V, then SDPA per sequence (bottom-right aligned causal mask)."""
    block_size, group = k_cache.shape[1], q.shape[1] // k_cache.shape[2]
    out = torch.empty_like(q)
    qsl, lens = query_start_loc.tolist(), seq_lens.tolist()
    for s, seq_len in enumerate(lens):
        start, end = qsl[s], qsl[s + 1]
        pos = torch.arange(seq_len, device=q.device)
        blocks = block_tables[s].long()[pos // block_size]
        k = k_cache[blocks, pos % block_size].repeat_interleave(group, dim=1).transpose(0, 1)
        v = v_cache[blocks, pos % block_size].repeat_interleave(group, dim=1).transpose(0, 1)
        q_pos = seq_len - (end - start) + torch.arange(end - start, device=q.device)
        mask = pos[None, :] <= q_pos[:, None]
        out[start:end] = torch.nn.functional.scaled_dot_product_attention(
            q[start:end].transpose(0, 1), k, v, attn_mask=mask, scale=scale).transpose(0, 1)
    return out


def timed(fn, reps):
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(begin.elapsed_time(end) * 1000)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--block-size", type=int, default=16)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: the Triton kernels are only timed on a GPU (the tests run them under the interpreter)")
        return 0
    from metroline.executors.torch import triton_attention as ta

    try:
        ref = importlib.import_module("metroline.executors.torch.reference_attention").paged_attention
    except (ImportError, AttributeError):
        ref = None
    dtype = getattr(torch, args.dtype)
    print(f"{torch.cuda.get_device_name()}, {args.dtype}, block size {args.block_size}; median microseconds")
    head = f"{'model':<13} {'case':<38} {'triton':>8} {'sdpa/seq':>9} {'speedup':>8} {'max|diff|':>10}"
    print(head + (f" {'reference':>10}" if ref else ""))
    for model, (heads, kv_heads, head_dim) in MODELS.items():
        for case, seqs in CASES.items():
            batch = build(seqs, heads, kv_heads, head_dim, args.block_size, dtype, "cuda")
            hints = dict(max_query_len=max(n for _, n in seqs), max_seq_len=max(s for s, _ in seqs))
            t_triton = timed(lambda: ta.paged_attention(**batch, **hints), args.reps)
            t_sdpa = timed(lambda: torch_sdpa(**batch), max(5, args.reps // 5))
            diff = (ta.paged_attention(**batch).float() - torch_sdpa(**batch).float()).abs().max().item()
            line = f"{model:<13} {case:<38} {t_triton:8.1f} {t_sdpa:9.1f} {t_sdpa / t_triton:7.1f}x {diff:10.2e}"
            if ref:
                line += f" {timed(lambda: ref(**batch), max(5, args.reps // 5)):10.1f}"
            print(line)
        for n in (64, 2048):
            k = torch.randn(n, kv_heads, head_dim, device="cuda", dtype=dtype)
            k_cache = torch.zeros(n // args.block_size + 2, args.block_size, kv_heads, head_dim, device="cuda", dtype=dtype)
            v_cache = torch.zeros_like(k_cache)
            slots = torch.randperm(k_cache.shape[0] * args.block_size, device="cuda")[:n]
            flat_k, flat_v = k_cache.view(-1, kv_heads, head_dim), v_cache.view(-1, kv_heads, head_dim)
            t_write = timed(lambda: ta.write_kv(k_cache, v_cache, k, k, slots), args.reps)
            t_copy = timed(lambda: (flat_k.index_copy_(0, slots, k), flat_v.index_copy_(0, slots, k)), args.reps)
            print(f"{model:<13} {f'write_kv {n} tokens vs index_copy_ x2':<38} {t_write:8.1f} {t_copy:9.1f} "
                  f"{t_copy / t_write:7.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
