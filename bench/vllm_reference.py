"""Reference schedules from vLLM's v1 scheduler, for checking `--preset vllm` against the real thing.

Drives vLLM 0.33's `vllm.v1.core.sched.scheduler.Scheduler` (pure Python: it runs on CPU) with a
fake model runner on a metroline workload and writes, per request, the step (1-based count of
non-empty steps) and the time of its first scheduling, its first token and its end:

- the fake model runner samples one token for each scheduled request whose computed tokens reach
  its known tokens (the last chunk of a prompt, or a decode), as a real forward would;
- the clock is metroline's simulated clock under `--cost-model steps`: each non-empty step lasts
  `--step-time` seconds (computed as `anchor + n * step_time`, like `SimulatedExecutor`), a request
  is submitted once the clock reaches its arrival, and an idle engine jumps to the next arrival;
- vLLM's block pool keeps one null block, so it gets `--num-blocks + 1` blocks: both engines then
  have `--num-blocks` blocks for requests;
- with `--speculative-config` (metroline's `SpeculativeConfig` as JSON; vLLM gets its `method`,
  `num_speculative_tokens` and n-gram sizes), the fake model runner is the drafter and the
  verifier: after a step, each request that sampled proposes `num_speculative_tokens` drafts (as
  many as `max_model_len` leaves; vLLM's `update_draft_token_ids`, which ignores requests still in
  their prefill), and of a step's scheduled drafts it accepts as many as metroline's simulated
  executor would (`metroline.executors.speculation_sim.AcceptanceModel`, keyed on the request, its
  position and the config's seed), none of the padding drafts (-1) vLLM gives a request admitted
  one token short of decoding: it returns `1 + accepted` sampled tokens.

Install (a separate venv: CPU torch pinned, vLLM's wheel without its dependencies, then the
modules its scheduler's imports need; never an unpinned torch, which pulls a CUDA build):

    python3 -m venv /work/vllm-venv
    /work/vllm-venv/bin/pip install torch==2.13.0          # the CPU build (+cpu), from local wheels here
    /work/vllm-venv/bin/pip install --no-deps vllm==0.33.0
    /work/vllm-venv/bin/pip install cbor2 pyzmq aiohttp openai openai_harmony pillow pybase64 cachetools \
        msgspec cloudpickle uvloop py-cpuinfo prometheus_client fastapi partial_json_parser einops \
        transformers pydantic pluggy structlog psutil numpy regex sentencepiece tokenizers requests tqdm \
        pyyaml xgrammar llguidance
    /work/vllm-venv/bin/pip list | grep '^torch '           # must still say 2.13.0+cpu

Run (from the repository root; metroline is imported from this checkout):

    /work/vllm-venv/bin/python bench/vllm_reference.py --workload shared-prefix --max-requests 60 \
        --num-blocks 200 --max-num-seqs 32 --max-batched-tokens 2048 --out tests/data/vllm_x.json

The JSON written is what `tests/test_vllm_preset.py` replays under `--preset vllm` and compares
request by request. The run always prints its step and preemption counts; `--out` also writes the
recording.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TINY_MODEL = {  # a local config.json: vLLM's ModelConfig wants a model; nothing is loaded
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2, "vocab_size": 32000,
    "max_position_embeddings": 131072, "torch_dtype": "float32", "rms_norm_eps": 1e-5,
}


def import_metroline() -> None:
    """Import metroline from this checkout (the repository root is the package)."""
    try:
        import metroline  # noqa: F401
        return
    except ImportError:
        pass
    spec = importlib.util.spec_from_file_location("metroline", ROOT / "__init__.py", submodule_search_locations=[str(ROOT)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["metroline"] = module
    spec.loader.exec_module(module)


def build_scheduler(args: argparse.Namespace, model_dir: Path, scheduler_cls=None, additional_config=None):
    """vLLM's scheduler for the engine of `args` (`scheduler_cls`: another class with the same
    constructor, such as metroline's bridge, given `additional_config` as `--additional-config`)."""
    import torch
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    model = ModelConfig(model=str(model_dir), skip_tokenizer_init=True, max_model_len=args.max_model_len,
                        dtype="float32", seed=0)
    sched = SchedulerConfig(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_batched_tokens,
                            max_model_len=args.max_model_len, is_encoder_decoder=False,
                            enable_chunked_prefill=not getattr(args, "no_chunked_prefill", False),
                            policy=args.policy, long_prefill_token_threshold=args.max_prefill_chunk or 0,
                            long_prefill_token_threshold_adaptive=args.max_prefill_chunk_adaptive,
                            async_scheduling=False)  # the synchronous Scheduler is what this harness drives
    cache = CacheConfig(block_size=args.block_size, enable_prefix_caching=not args.no_prefix_sharing)
    cache.num_gpu_blocks = args.num_blocks + 1  # + vLLM's null block
    config = VllmConfig(model_config=model, scheduler_config=sched, cache_config=cache,
                        device_config=DeviceConfig(device="cpu"),
                        speculative_config=vllm_speculative_config(getattr(args, "speculative_config", None), model),
                        **({"additional_config": additional_config} if additional_config else {}))
    if getattr(args, "async_scheduling", False):  # vLLM's config turns it off on CPU; its scheduler runs anyway
        config.scheduler_config.async_scheduling = True
    spec = FullAttentionSpec(block_size=args.block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)
    kv = KVCacheConfig(num_blocks=args.num_blocks + 1, kv_cache_tensors=[],
                       kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    cls = scheduler_cls or Scheduler
    return cls(config, kv, StructuredOutputManager(config), block_size=args.block_size, log_stats=False)


def vllm_speculative_config(spec: dict | None, model):
    """vLLM's `SpeculativeConfig` for metroline's (`spec`, a dict), or None."""
    if not spec:
        return None
    from vllm.config import ParallelConfig, SpeculativeConfig

    if spec.get("method", "ngram") != "ngram":
        raise SystemExit("--speculative-config: only the ngram method is recorded (a draft model needs a model)")
    fields = {k: spec[k] for k in ("prompt_lookup_min", "prompt_lookup_max") if spec.get(k) is not None}
    return SpeculativeConfig(method="ngram", num_speculative_tokens=spec["num_speculative_tokens"], **fields,
                             target_model_config=model, target_parallel_config=ParallelConfig())


def make_request(item, rid: str, block_hasher):
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    extra = {"tenant": item.tenant} if item.tenant != "default" else None  # read by metroline's bridge only
    params = SamplingParams(max_tokens=item.output_len, ignore_eos=True, temperature=0.0, extra_args=extra)
    return Request(rid, item.prompt_token_ids(), params, None, arrival_time=item.arrival_s, block_hasher=block_hasher,
                   priority=item.priority)


def replay(args: argparse.Namespace, workload, model_dir: Path, scheduler_cls=None, additional_config=None,
           trace: list | None = None) -> dict:
    """Replay the workload on vLLM's scheduler with the fake model runner and the step clock
    (`scheduler_cls`, `additional_config`: see `build_scheduler`; metroline's bridge reads the
    step clock). `trace`, when given, gets each step's schedule: the scheduled (request id,
    tokens) pairs in vLLM's order and the preempted ids."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput

    scheduler = build_scheduler(args, model_dir, scheduler_cls, additional_config)
    if hasattr(scheduler, "metroline"):
        scheduler.metroline.clock = lambda: now  # the step clock below (read when a step starts)
    hash_fn = get_hash_fn_by_name(scheduler.cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(args.block_size, hash_fn)
    spec = getattr(args, "speculative_config", None)
    verifier = FakeVerifier(spec, args.max_model_len) if spec else None

    items, dt = workload.items, args.step_time
    anchor, ticks, steps = 0.0, 0, 0
    now = 0.0
    live: dict[str, object] = {}
    record: dict[str, dict] = {}
    i, preemptions = 0, 0
    while True:
        while i < len(items) and items[i].arrival_s <= now:
            rid = str(i)
            req = make_request(items[i], rid, hasher)
            scheduler.add_request(req)
            live[rid] = req
            record[rid] = {}
            i += 1
        if not live:
            if i == len(items):
                break
            anchor, ticks, now = items[i].arrival_s, 0, items[i].arrival_s
            continue
        out = scheduler.schedule()
        preemptions += len(out.preempted_req_ids or ())
        scheduled = out.num_scheduled_tokens
        if trace is not None:
            trace.append((list(scheduled.items()), sorted(out.preempted_req_ids or ())))
        if not scheduled:
            if out.preempted_req_ids:  # a requester a plugin named as its own victim: vLLM's step stops there
                empty = ModelRunnerOutput(req_ids=[], req_id_to_index={}, sampled_token_ids=[])
                scheduler.update_from_output(out, empty)
                continue
            if i < len(items) and items[i].arrival_s > now:
                anchor, ticks, now = items[i].arrival_s, 0, items[i].arrival_s
                continue
            raise RuntimeError(f"vLLM scheduled nothing at t={now} with {len(live)} requests live")
        start = now
        steps += 1
        ticks += 1
        now = anchor + ticks * dt
        req_ids, sampled = [], []
        for rid in scheduled:
            req = live[rid]
            rec = record[rid]
            if "first_scheduled" not in rec:
                rec["first_scheduled"] = [steps, start]
            req_ids.append(rid)
            # the scheduler advanced num_computed_tokens already: a token when it reached the end,
            # and the accepted drafts after it
            if req.num_computed_tokens < req.num_tokens:
                sampled.append([])
            elif verifier is None:
                sampled.append([1])
            else:
                sampled.append(verifier.verify(req, out.scheduled_spec_decode_tokens.get(rid, ())))
        output = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: k for k, r in enumerate(req_ids)},
                                   sampled_token_ids=sampled)
        scheduler.update_from_output(out, output)
        for rid, tokens in zip(req_ids, sampled):
            if not tokens:
                continue
            req, rec = live[rid], record[rid]
            if "first_token" not in rec:
                rec["first_token"] = [steps, now]
            if req.is_finished():
                rec["finish"] = [steps, now]
                rec["preemptions"] = req.num_preemptions
                del live[rid]
        if verifier is not None:  # the drafter runs after the step, as vLLM's EngineCore.post_step takes its drafts
            scheduler.update_draft_token_ids(DraftTokenIds(*verifier.propose(req_ids, sampled, live)))
    result = {"preemptions": preemptions, "steps": steps, "requests": record}
    if verifier is not None:
        result["drafts"] = {"num_draft_tokens": verifier.drafted, "num_accepted_tokens": verifier.accepted,
                            "num_padding_drafts": verifier.padding}
    return result


class FakeVerifier:
    """The fake model runner's drafter and verifier under speculative decoding (see the module
    docstring): metroline's acceptance model decides how many drafts each step accepts."""

    def __init__(self, spec: dict, max_model_len: int) -> None:
        import types

        from metroline.core.speculative_config import parse_speculative_config
        from metroline.executors.speculation_sim import AcceptanceModel

        self.config = parse_speculative_config(spec)
        self.model = AcceptanceModel(self.config)
        self.max_model_len = max_model_len
        self._seq = types.SimpleNamespace  # what the acceptance model reads of a sequence
        self.drafted = self.accepted = self.padding = 0

    def verify(self, req, drafts) -> list[int]:
        """The tokens a step samples for `req` (which reached its known tokens): its own and one
        per accepted draft; padding drafts (-1) are never accepted."""
        k = 0
        while k < len(drafts) and drafts[k] >= 0:
            k += 1
        self.padding += len(drafts) - k
        if not k:
            return [1]
        seq = self._seq(request_id=req.request_id, index=0, metadata={}, token_ids=req.all_token_ids)
        a = self.model.accepted(seq, k)
        self.drafted += k
        self.accepted += a
        return [1] * (1 + a)

    def propose(self, req_ids: list[str], sampled: list[list[int]], live: dict) -> tuple[list, list]:
        """Drafts for each request that sampled in the step and is still live: as many as the
        config asks, within `max_model_len` (vLLM's n-gram proposer caps them so)."""
        ids, drafts = [], []
        for rid, tokens in zip(req_ids, sampled):
            req = live.get(rid)
            if not tokens or req is None:
                continue
            ids.append(rid)
            drafts.append([1] * max(0, min(self.config.num_speculative_tokens, self.max_model_len - req.num_tokens)))
        return ids, drafts


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """The engine's flags, named as metroline names them (`EngineConfig`'s fields)."""
    p.add_argument("--num-blocks", type=int, required=True, help="blocks for requests (metroline's num_blocks)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-batched-tokens", type=int, default=2048)
    p.add_argument("--max-model-len", type=int, default=32768)
    p.add_argument("--step-time", type=float, default=0.01)
    p.add_argument("--policy", choices=("fcfs", "priority"), default="fcfs", help="vLLM's scheduling policy")
    p.add_argument("--max-prefill-chunk", type=int, help="vLLM's long_prefill_token_threshold")
    p.add_argument("--max-prefill-chunk-adaptive", action="store_true",
                   help="vLLM's long_prefill_token_threshold_adaptive")
    p.add_argument("--no-prefix-sharing", action="store_true", help="vLLM without prefix caching")
    p.add_argument("--no-chunked-prefill", action="store_true",
                   help="vLLM's enable_chunked_prefill=False (metroline's enable_chunked_prefill=false)")
    p.add_argument("--speculative-config", type=json.loads,
                   help="speculative decoding: metroline's SpeculativeConfig as JSON (method ngram)")


def engine_fields(args: argparse.Namespace) -> dict:
    """The recording's `engine` table: what `EngineConfig` needs to replay it."""
    return {"num_blocks": args.num_blocks, "block_size": args.block_size, "max_num_seqs": args.max_num_seqs,
            "max_num_batched_tokens": args.max_batched_tokens, "max_model_len": args.max_model_len,
            "step_time": args.step_time, "policy": args.policy, "max_prefill_chunk": args.max_prefill_chunk,
            "max_prefill_chunk_adaptive": args.max_prefill_chunk_adaptive,
            "enable_prefix_caching": not args.no_prefix_sharing, "speculative_config": args.speculative_config,
            "enable_chunked_prefill": not args.no_chunked_prefill}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", required=True, help="a metroline built-in workload or spec/trace file")
    p.add_argument("--seed", type=int)
    p.add_argument("--max-requests", type=int)
    p.add_argument("--rate-scale", type=float, default=1.0)
    p.add_argument("--length-scale", type=float, default=1.0)
    add_engine_args(p)
    p.add_argument("--traces-dir")
    p.add_argument("--out", help="write the recording (JSON) here")
    args = p.parse_args(argv)

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    import_metroline()
    from metroline.core.workloads.build import build_workload

    workload = build_workload(args.workload, seed=args.seed, rate_scale=args.rate_scale,
                              length_scale=args.length_scale, max_requests=args.max_requests,
                              traces_dir=args.traces_dir)
    import tempfile

    import vllm

    wall = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(TINY_MODEL))
        result = replay(args, workload, Path(tmp))
    wall = time.perf_counter() - wall
    doc = {
        "reference": f"vllm {vllm.__version__} v1 Scheduler, fake model runner (one token per request whose "
                     "computed tokens reach its known tokens), steps of step_time seconds",
        "workload": {"source": args.workload, "seed": args.seed, "max_requests": args.max_requests,
                     "rate_scale": args.rate_scale, "length_scale": args.length_scale},
        "engine": engine_fields(args),
        **result,
    }
    print(f"{args.workload}: {len(result['requests'])} requests, {result['steps']} steps, "
          f"{result['preemptions']} preemptions ({wall:.1f} s)")
    if args.out:
        Path(args.out).write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
