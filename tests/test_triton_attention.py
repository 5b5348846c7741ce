"""The Triton paged-attention kernels against a plain torch reference written here (gather each
sequence's K/V through its block table, masked softmax in float64).

Without CUDA the kernels run on CPU tensors under Triton's interpreter: TRITON_INTERPRET must be
set before the kernels are decorated, so it is set here before the module is imported (and the
module is reloaded if another test imported it first). With CUDA the same cases run compiled on
the GPU, also in bfloat16 and float16 at a looser tolerance."""

from __future__ import annotations

import importlib
import os
import random
import subprocess
import sys
import textwrap

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402

_PREFIX = "metroline.executors.torch.triton_"  # the kernel modules: triton_attention and its parts
ta = importlib.import_module(_PREFIX + "attention")
if not HAS_CUDA and not sys.modules[_PREFIX + "common"].interpreted():
    # imported before TRITON_INTERPRET was set: import every kernel module again to decorate anew
    for _name in [n for n in sys.modules if n.startswith(_PREFIX)]:
        del sys.modules[_name]
    ta = importlib.import_module(_PREFIX + "attention")
tc = sys.modules[_PREFIX + "common"]

INTERPRETED = tc.interpreted()
DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(not INTERPRETED, reason="CPU tensors need TRITON_INTERPRET=1")),
    pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")),
]
# the interpreter accepts tiny tiles; compiled kernels need >= 16 (small tiles = many tiles per sequence)
TILES = {"block_m": 16, "block_n": 16}


def reference(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, window=None, softcap=None,
              sinks=None):
    """Per sequence: gather positions 0..seq_len-1 through the block table, repeat KV heads for
    the query-head groups, causal softmax attention in float64 (with a sliding `window`: keys
    `p - window < k <= p`; `softcap`: `softcap * tanh(s / softcap)` before the mask; `sinks`: one
    extra logit per head in the softmax, its probability dropped)."""
    num_heads = q.shape[1]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty(q.shape, dtype=torch.float64)
    for s in range(seq_lens.shape[0]):
        start, end = int(query_start_loc[s]), int(query_start_loc[s + 1])
        seq_len, q_len = int(seq_lens[s]), end - start
        pos = torch.arange(seq_len)
        blocks = block_tables[s].cpu().long()[pos // block_size]
        k = k_cache.cpu().double()[blocks, pos % block_size].repeat_interleave(group, dim=1)
        v = v_cache.cpu().double()[blocks, pos % block_size].repeat_interleave(group, dim=1)
        qs = q[start:end].cpu().double()
        q_pos = seq_len - q_len + torch.arange(q_len)
        scores = torch.einsum("thd,khd->htk", qs, k) * scale
        if softcap is not None:
            scores = softcap * torch.tanh(scores / softcap)
        hidden = pos[None, None, :] > q_pos[None, :, None]
        if window is not None:
            hidden |= pos[None, None, :] <= q_pos[None, :, None] - window
        scores = scores.masked_fill(hidden, float("-inf"))
        if sinks is not None:
            sink = sinks.cpu().double()[:, None, None].expand(-1, q_len, 1)
            probs = torch.cat([scores, sink], dim=-1).softmax(-1)[..., :-1]
        else:
            probs = scores.softmax(-1)
        out[start:end] = torch.einsum("htk,khd->thd", probs, v)
    return out


def make_batch(seqs, *, block_size, num_kv_heads, group, head_dim, dtype=torch.float32, device="cpu", seed=0):
    """A packed batch for `seqs` = [(seq_len, q_len), ...]: random caches (every slot filled, so a
    read outside a sequence's blocks changes the result), blocks handed out in a shuffled order,
    block tables padded with more (valid but foreign) block ids."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    need = [-(-seq_len // block_size) for seq_len, _ in seqs]
    width = max(need) + 2
    num_blocks = sum(need) + 3
    ids = list(range(num_blocks))
    rng.shuffle(ids)
    tables = []
    for n in need:
        own, ids = ids[:n], ids[n:]
        tables.append(own + [rng.randrange(num_blocks) for _ in range(width - n)])
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen)
    v_cache = torch.randn(shape, generator=gen)
    q_lens = [q_len for _, q_len in seqs]
    q = torch.randn((sum(q_lens), num_kv_heads * group, head_dim), generator=gen)
    qsl = [0]
    for n in q_lens:
        qsl.append(qsl[-1] + n)

    def put(t, dt=dtype):
        return t.to(device=device, dtype=dt)

    return dict(
        q=put(q), k_cache=put(k_cache), v_cache=put(v_cache),
        block_tables=put(torch.tensor(tables), torch.int32),
        seq_lens=put(torch.tensor([s for s, _ in seqs]), torch.int32),
        query_start_loc=put(torch.tensor(qsl), torch.int32),
        scale=head_dim ** -0.5,
    )


TOL = {torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 3e-2}


def check(seqs, *, device="cpu", dtype=torch.float32, block_size=4, num_kv_heads=2, group=2, head_dim=64, **kw):
    batch = make_batch(seqs, block_size=block_size, num_kv_heads=num_kv_heads, group=group, head_dim=head_dim,
                       dtype=dtype, device=device)
    variant = {k: kw.pop(k) for k in ("window", "softcap", "sinks") if k in kw}
    if "sinks" in variant:
        variant["sinks"] = variant["sinks"].to(device)
    out = ta.paged_attention(**batch, **{**TILES, **kw}, **variant)
    assert out.shape == batch["q"].shape and out.dtype == dtype and out.device.type == device
    expected = reference(**batch, **variant)
    err = (out.cpu().double() - expected).abs().max().item()
    assert err < TOL[dtype], f"max abs error {err} for {seqs}"


def decode_seqs(lens):
    return [(n, 1) for n in lens]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("group", [1, 2, 4])
def test_decode_only(device, block_size, group):
    # lengths: 1, inside a block, several key tiles (16 keys a tile here), a block-table edge
    check(decode_seqs([1, 3, 17, 50, 32]), device=device, block_size=block_size, group=group)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("splits", [2, 4])
def test_decode_split_keys(device, splits):
    # 70 keys = 5 tiles: uneven splits, and some splits empty for the short sequences
    check(decode_seqs([70, 1, 9, 33]), device=device, num_splits=splits, block_size=4, group=4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("group", [1, 2, 4])
def test_prefill_only(device, block_size, group):
    # (context after the step, new tokens): a whole prompt, chunks over a cached prefix that ends
    # inside a block (6 cached of block 4 / 16), a 2-token chunk, a chunk longer than a query tile
    check([(9, 9), (26, 20), (7, 2), (40, 37)], device=device, block_size=block_size, group=group)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("group", [1, 2, 3, 4])
def test_mixed_batch(device, group):
    seqs = [(12, 1), (5, 5), (1, 1), (30, 11), (19, 1), (3, 2)]
    check(seqs, device=device, block_size=4, group=group)
    check(seqs, device=device, block_size=4, group=group, num_splits=2, max_query_len=11, max_seq_len=30)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("head_dim", [128, 80])
def test_head_dims(device, head_dim):
    check([(21, 1), (14, 9)], device=device, block_size=8, group=2, head_dim=head_dim)


@pytest.mark.parametrize("device", DEVICES)
def test_default_tiles(device):
    # the GPU defaults (64 query rows, 32 keys a tile) and a GQA group of 8 (16 rows padded)
    batch = [(100, 1), (45, 45), (70, 3)]
    check(batch, device=device, block_size=16, group=8, num_kv_heads=1, block_m=64, block_n=32)


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_cuda(dtype):
    seqs = [(300, 1), (12, 1), (260, 200), (33, 2), (1, 1)]
    check(seqs, device="cuda", dtype=dtype, block_size=16, group=4, block_m=64, block_n=32)
    check(seqs, device="cuda", dtype=dtype, block_size=16, group=4, num_splits=4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("interleaved", [False, True])
def test_write_kv_then_attend(device, interleaved):
    """write_kv stores exactly the given rows at their slots (a negative slot is skipped, other
    slots untouched); attention over the written cache equals the reference. `interleaved`: the
    caches are strided views, K and V halves of one [num_blocks, 2, block_size, heads, dim] tensor."""
    block_size, kvh, d = 4, 2, 64
    batch = make_batch([(10, 3), (6, 1)], block_size=block_size, num_kv_heads=kvh, group=2, head_dim=d, device=device)
    if interleaved:
        both = torch.stack([batch["k_cache"], batch["v_cache"]], dim=1)
        batch["k_cache"], batch["v_cache"] = both[:, 0], both[:, 1]
        assert not batch["k_cache"].is_contiguous()
    k_cache, v_cache, tables = batch["k_cache"], batch["v_cache"], batch["block_tables"].cpu()
    # the new tokens: positions 7, 8, 9 of sequence 0 and position 5 of sequence 1, plus a padding row
    slots = [int(tables[0, p // block_size]) * block_size + p % block_size for p in (7, 8, 9)]
    slots += [int(tables[1, 1]) * block_size + 1, -1]
    k_new = torch.randn(5, kvh, d).to(device)
    v_new = torch.randn(5, kvh, d).to(device)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    ta.write_kv(k_cache, v_cache, k_new, v_new, torch.tensor(slots, dtype=torch.int64, device=device))
    flat_k, flat_v = k_cache.reshape(-1, kvh, d), v_cache.reshape(-1, kvh, d)  # copies when interleaved
    assert torch.equal(flat_k[slots[:4]], k_new[:4]) and torch.equal(flat_v[slots[:4]], v_new[:4])
    untouched = torch.ones(flat_k.shape[0], dtype=torch.bool)
    untouched[slots[:4]] = False
    assert torch.equal(flat_k[untouched], before_k.reshape(-1, kvh, d)[untouched])
    assert torch.equal(flat_v[untouched], before_v.reshape(-1, kvh, d)[untouched])
    out = ta.paged_attention(**batch, **TILES)
    assert (out.cpu().double() - reference(**batch)).abs().max().item() < 1e-3


@pytest.mark.skipif(not INTERPRETED, reason="checks the interpreter path")
def test_interpreter_runs_the_kernels(monkeypatch):
    """The CPU results come from the Triton kernels run by the interpreter (no torch fallback):
    the dispatch launches the decode kernel for every batch, the prefill kernel only when some
    sequence has more than one query token, the merge kernel only with key splits; and a kernel
    that is not launched leaves its rows unwritten."""
    from triton.runtime.interpreter import InterpretedFunction

    launches = []

    class Counting:
        def __init__(self, name, kernel):
            assert isinstance(kernel, InterpretedFunction)
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid):
            launches.append(self.name)
            return self.kernel[grid]

    td, tp = sys.modules[_PREFIX + "decode"], sys.modules[_PREFIX + "prefill"]
    for module, name in ((td, "decode_kernel"), (tp, "prefill_kernel"), (td, "decode_merge_kernel")):
        monkeypatch.setattr(module, name, Counting(name, getattr(module, name)))
    check(decode_seqs([5, 9]))
    assert launches == ["decode_kernel"]
    launches.clear()
    check([(5, 1), (9, 4)], num_splits=2)
    assert launches == ["decode_kernel", "decode_merge_kernel", "prefill_kernel"]

    # without the prefill launch the prefill sequence's rows are not computed; the decode row is
    monkeypatch.setattr(tp, "prefill_kernel", {})  # a grid lookup that fails: the launch happens
    # (seed 1: no earlier call computed these rows, so memory torch.empty reuses cannot hold them)
    batch = make_batch([(5, 1), (9, 4)], block_size=4, num_kv_heads=2, group=2, head_dim=64, seed=1)
    with pytest.raises(KeyError):
        ta.paged_attention(**batch, **TILES)
    monkeypatch.setattr(tp, "prefill_kernel", {(2, 2, 1): lambda *a, **k: None})  # launched, does nothing
    out = ta.paged_attention(**batch, **TILES, max_query_len=4).double()
    expected = reference(**batch)
    assert (out[0] - expected[0]).abs().max().item() < 1e-3
    assert not torch.allclose(out[1:], expected[1:], atol=1e-3)


@pytest.mark.skipif(HAS_CUDA, reason="the interpreter path is for machines without CUDA")
def test_interpreter_is_set_up_whatever_was_imported_first():
    """In a fresh process that imported torch, triton and the kernels module before this test
    module (so the kernels were decorated for a GPU), importing this module still runs the
    kernels under the interpreter, and they match the reference."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = textwrap.dedent(f"""
        import importlib.util, torch, triton
        import metroline.executors.torch.triton_attention
        from metroline.executors.torch import triton_common as first
        assert not first.interpreted()
        spec = importlib.util.spec_from_file_location("tta", {__file__!r})
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        assert mod.tc.interpreted()
        mod.check([(9, 1), (12, 5)])
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


_COMPILE_FOR_SM90 = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from metroline.executors.torch import triton_attention as ta, triton_decode as td, triton_prefill as tp

ELEM = {"q_ptr", "k_cache_ptr", "v_cache_ptr", "out_ptr", "k_ptr", "v_ptr"}
STRIDES = {"q_strides": 3, "out_strides": 3, "k_strides": 3, "v_strides": 3, "kc_strides": 4, "vc_strides": 4}

def types(fn, dtype, consts):
    def one(name):
        if name in consts:
            return "constexpr"
        if name in ELEM:
            return dtype
        if name in STRIDES:  # a tuple of strides: a cache's 4, a token tensor's 3
            return ("i32",) * STRIDES[name]
        return {"part_acc_ptr": "*fp32", "part_ml_ptr": "*fp32", "bt_ptr": "*i32", "seq_lens_ptr": "*i32",
                "qsl_ptr": "*i32", "slot_ptr": "*i64", "sinks_ptr": "*fp32", "qk_scale": "fp32", "cap_in": "fp32",
                "cap_out": "fp32"}.get(name, "i32")
    return {name: one(name) for name in fn.arg_names}

def build(fn, dtype, warps, **consts):
    src = ASTSource(fn, types(fn, dtype, consts), consts)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    return kernel.asm["ptx"]

PLAIN = dict(HAS_SOFTCAP=False, HAS_WINDOW=False, HAS_SINKS=False)
ALL = dict(HAS_SOFTCAP=True, HAS_WINDOW=True, HAS_SINKS=True)
for variant in (PLAIN, ALL):
    ptx = build(td.decode_kernel, "*bf16", 8, GROUP=4, BLOCK_M=16, BLOCK_N=32, BLOCK_D=128, NUM_SPLITS=4, IEEE=False,
                **variant)
    assert "mma" in ptx, "decode: no tensor-core instruction"
    ptx = build(tp.prefill_kernel, "*fp16", 4, GROUP=3, TILE_TOKENS=21, BLOCK_M=64, BLOCK_N=32, BLOCK_D=64,
                IEEE=False, **variant)
    assert "mma" in ptx, "prefill: no tensor-core instruction"
    build(td.decode_kernel, "*fp32", 8, GROUP=2, BLOCK_M=16, BLOCK_N=32, BLOCK_D=64, NUM_SPLITS=1, IEEE=True,
          **variant)
    build(tp.prefill_kernel, "*fp32", 8, GROUP=1, TILE_TOKENS=64, BLOCK_M=64, BLOCK_N=32, BLOCK_D=64, IEEE=True,
          **variant)
    build(td.decode_merge_kernel, "*bf16", 4, BLOCK_D=128, NUM_SPLITS=4, HAS_SINKS=variant["HAS_SINKS"])
build(ta.write_kv_kernel, "*bf16", 4, BLOCK_H=8, BLOCK_D=128)
print("ok")
"""


def test_kernels_compile_for_a_gpu_without_one():
    """The kernels compile for sm_90 (Triton's own compiler and bundled ptxas, no GPU needed) with
    the tile shapes `paged_attention` launches, and the half-precision dots use tensor cores:
    the interpreter alone would accept shapes and constructs a GPU build rejects."""
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _COMPILE_FOR_SM90], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_bad_input_names_field_and_limit():
    batch = make_batch([(5, 1)], block_size=4, num_kv_heads=2, group=2, head_dim=64)
    with pytest.raises(ValueError, match=r"num_heads \(3\) must be a multiple of num_kv_heads \(2\)"):
        ta.paged_attention(**{**batch, "q": torch.randn(1, 3, 64)})
    with pytest.raises(ValueError, match="q, k_cache and v_cache must share a dtype"):
        ta.paged_attention(**{**batch, "q": batch["q"].half()})
    with pytest.raises(ValueError, match="query_start_loc must have num_seqs \\+ 1 = 2 entries"):
        ta.paged_attention(**{**batch, "query_start_loc": torch.tensor([0], dtype=torch.int32)})
    with pytest.raises(ValueError, match="block_m must be a power of two >= 16, got 24"):
        ta.paged_attention(**batch, block_m=24)
    big = torch.zeros(2, 4, 1, 512)
    with pytest.raises(ValueError, match="head_dim must be <= 256, got 512"):
        ta.paged_attention(torch.zeros(1, 1, 512), big, big, batch["block_tables"], batch["seq_lens"],
                           batch["query_start_loc"], 1.0)
    with pytest.raises(ValueError, match=r"slot_mapping must be an integer tensor of shape \[1\]"):
        ta.write_kv(batch["k_cache"], batch["v_cache"], torch.zeros(1, 2, 64), torch.zeros(1, 2, 64),
                    torch.zeros(2, dtype=torch.int64))


def test_cpu_without_interpreter_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(tc, "interpreted", lambda: False)
    batch = make_batch([(5, 1)], block_size=4, num_kv_heads=2, group=2, head_dim=64)
    with pytest.raises(RuntimeError, match="triton attention needs CUDA tensors \\(got cpu\\)"):
        ta.paged_attention(**batch)


# --- the attention variants transformers asks for: sliding window, logit softcap, sinks -------------

SINKS = torch.tensor([0.5, -1.0, 2.0, 8.0, 0.0, -3.0, 1.5, 4.0])  # one logit per query head (8 heads max)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("window", [1, 5, 16])
def test_sliding_window(device, window):
    # decodes and chunks longer and shorter than the window, a chunk starting past it, split keys
    seqs = [(30, 1), (3, 1), (40, 37), (26, 20), (9, 9), (50, 2)]
    check(seqs, device=device, block_size=4, group=2, window=window)
    check(decode_seqs([70, 1, 9, 33]), device=device, block_size=4, group=2, window=window, num_splits=4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("softcap", [1.0, 50.0])
def test_softcap(device, softcap):
    seqs = [(12, 1), (5, 5), (30, 11), (19, 1), (3, 2)]
    check(seqs, device=device, block_size=4, group=2, softcap=softcap)
    check(decode_seqs([70, 9]), device=device, block_size=4, group=2, softcap=softcap, num_splits=2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("splits", [1, 4])
def test_sinks(device, splits):
    # a sink logit of 8 takes most of the probability: the scale of every output row depends on it
    seqs = [(12, 1), (5, 5), (30, 11), (70, 1), (3, 2)]
    check(seqs, device=device, block_size=4, group=4, num_kv_heads=2, sinks=SINKS, num_splits=splits)


@pytest.mark.parametrize("device", DEVICES)
def test_all_variants_together_match_the_torch_reference(device):
    """The executor's two implementations agree: the kernels and `reference_attention` (the CPU
    path) on one batch with window, softcap and sinks at once."""
    from metroline.executors.torch import reference_attention

    batch = make_batch([(30, 1), (26, 20), (9, 9), (50, 2)], block_size=4, num_kv_heads=2, group=2, head_dim=64,
                       device=device)
    variant = dict(window=6, softcap=2.0, sinks=SINKS[:4].to(device))
    out = ta.paged_attention(**batch, **TILES, **variant)
    ref = reference_attention.paged_attention(*(batch[k].cpu() for k in ("q", "k_cache", "v_cache", "block_tables",
                                                                         "seq_lens", "query_start_loc")),
                                              batch["scale"], window=6, softcap=2.0, sinks=SINKS[:4])
    assert (out.cpu() - ref).abs().max().item() < 1e-4
    assert (ref.double() - reference(**batch, **{**variant, "sinks": SINKS[:4]})).abs().max().item() < 1e-4


def test_variant_arguments_are_checked():
    batch = make_batch([(5, 1)], block_size=4, num_kv_heads=2, group=2, head_dim=64)
    with pytest.raises(ValueError, match="window must be >= 1"):
        ta.paged_attention(**batch, window=0)
    with pytest.raises(ValueError, match="softcap must be > 0"):
        ta.paged_attention(**batch, softcap=-1.0)
    with pytest.raises(ValueError, match=r"sinks must be \[num_heads = 4\]"):
        ta.paged_attention(**batch, sinks=torch.zeros(3))
