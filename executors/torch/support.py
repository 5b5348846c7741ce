"""Which Hugging Face models the torch executor runs exactly, and the checks that refuse the others.

metroline replaces a model's attention with its paged attention through transformers'
`AttentionInterface`, and packs the step's sequences into one forward. That is exact only when:
- the model's attention goes through the interface (`_supports_attention_backend`), in every layer,
  once per layer, and the registered function writes the layer's KV (checked by a probe forward at
  load, `probe`);
- every argument the model passes to the attention function is honoured (sliding window, logit
  softcapping, sinks) or neutral (`attention.check_arguments`): any other is refused by name;
- every layer is full or sliding-window attention (no chunked, linear or state-space layers), and
  a window the model puts only into its mask is honoured (`attention.paged_mask`);
- the model takes its positions from `position_ids`, and a short packed, chunked, prefix-shared
  run on the paged attention gives its own forward's logits (`parity_probe`, at load);
- the rotary embedding does not depend on the pack: `default`, `linear`, `llama3`, `yarn` and
  `proportional` are fixed; `dynamic` (NTK) changes only past `max_position_embeddings`, which
  `max_model_len` never exceeds; `longrope` switches to its long factors past
  `original_max_position_embeddings`, so `max_model_len` stops there (`context_limit`).

Each failure is an `UnsupportedModel`: one line naming the model type and the cause.
"""

from __future__ import annotations

from typing import Any

import torch

from . import attention, parity_probe

VERIFIED_ARCHITECTURES = (
    "llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi", "phi3", "olmo",
    "olmo2", "gpt_neox", "gpt2", "opt", "gpt_oss", "starcoder2", "cohere", "granite",
)
"""Model types that `tests/test_model_support.py` checks token for token against HF `generate`
(the support matrix of docs/guide/real-executor.md is made from that test)."""

STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "proportional")
"""Rope types whose frequencies are fixed at load: any pack of positions gets each its own rotation."""

LAYER_TYPES = ("full_attention", "sliding_attention")


class UnsupportedModel(ValueError):
    """A model the torch executor cannot run exactly; the message names the model type and why."""


def model_type(config: Any) -> str:
    return getattr(config, "model_type", None) or type(config).__name__


def refuse(config: Any, cause: str) -> UnsupportedModel:
    """The one-line error for a model of `config`'s type: `<type>: <cause> (supported: ...)`."""
    return UnsupportedModel(f"{model_type(config)}: {cause} (supported: {', '.join(VERIFIED_ARCHITECTURES)})")


def one_line(error: BaseException, limit: int = 160) -> str:
    """`error` as `Type: first line of its message`, at most `limit` characters of message."""
    first = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    first = first if len(first) <= limit else first[:limit - 3] + "..."
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def config_value(config: Any, name: str, default: Any = None) -> Any:
    """`config.name` (or `default`); a config that cannot give one value for the whole model (a
    per-layer attribute, Gemma-4's `head_dim`) is refused in one line."""
    try:
        return getattr(config, name, default)
    except Exception as e:  # noqa: BLE001 - transformers raises its own error types here
        raise refuse(config, f"its {name} is not one value for every layer ({type(e).__name__}), and metroline's "
                             f"paged cache has one KV shape for all layers") from None


def kv_shape(config: Any) -> tuple[int, int, int]:
    """`(layers, KV heads, head dim)` of the paged cache for a model of `config` (refused in one line
    where one of them is not a single value for the whole model: `config_value`)."""
    values = {name: config_value(config, name) for name in ("num_hidden_layers", "num_attention_heads", "hidden_size")}
    missing = [name for name, v in values.items() if not isinstance(v, int)]
    if missing:
        raise refuse(config, f"its config gives no {', '.join(missing)} (a composite model, whose text model's "
                             f"config metroline does not read)")
    heads = values["num_attention_heads"]
    kv_heads = config_value(config, "num_key_value_heads") or heads
    head_dim = config_value(config, "head_dim") or values["hidden_size"] // heads
    return values["num_hidden_layers"], kv_heads, head_dim


def check_class(model_class: type, config: Any) -> None:
    """Refuse a model class whose attention does not go through transformers' AttentionInterface,
    before any weights are loaded."""
    if not getattr(model_class, "_supports_attention_backend", False):
        raise refuse(config, "attention does not go through transformers' AttentionInterface")


def rope_types(config: Any) -> list[tuple[str, dict]]:
    """`(rope_type, parameters)` of each rope the config sets (one, or one per layer type)."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    if not isinstance(params, dict):
        return []
    if "rope_type" in params or "type" in params:
        return [(params.get("rope_type", params.get("type")), params)]
    return [(p.get("rope_type", p.get("type", "default")), p) for p in params.values() if isinstance(p, dict)]


def context_limit(config: Any) -> tuple[int | None, str | None]:
    """The longest sequence the model runs exactly (its context, or where a length-dependent rope
    would change), and the reason when it is shorter than the model's context."""
    limit = getattr(config, "max_position_embeddings", None)
    reason = None
    for rope_type, params in rope_types(config):
        if rope_type in STATIC_ROPE_TYPES or rope_type is None:
            continue
        if "dynamic" in rope_type:
            continue  # grows only past max_position_embeddings, the limit anyway
        if rope_type == "longrope":
            original = params.get("original_max_position_embeddings") or getattr(
                config, "original_max_position_embeddings", None)
            if original is None:
                raise refuse(config, "rope_type longrope without original_max_position_embeddings")
            if limit is None or original < limit:
                limit = int(original)
                reason = (f"{model_type(config)}'s longrope switches to its long rope factors past "
                          f"original_max_position_embeddings={original}, for the whole batch; metroline "
                          f"runs it exactly up to there")
            continue
        raise refuse(config, f"rope_type {rope_type!r} depends on the sequence length")
    return limit, reason


def check_config(config: Any) -> None:
    """Refuse layer kinds the paged attention does not implement, and length-dependent ropes it
    cannot bound."""
    for kind in dict.fromkeys(getattr(config, "layer_types", None) or ()):
        if kind not in LAYER_TYPES:
            raise refuse(config, f"layer type {kind!r} is not attention metroline implements (full or sliding)")
    if getattr(config, "is_encoder_decoder", False):
        raise refuse(config, "encoder-decoder models are not causal LMs metroline can page")
    context_limit(config)


def probe(model: Any, num_layers: int, num_kv_heads: int, head_dim: int, ops: Any) -> None:
    """One packed forward of two short sequences on scratch KV: every layer must call the
    registered attention exactly once, with arguments it honours, and write its KV. Then the
    numbers (`parity_probe.check`): a short packed, chunked, prefix-shared run must give the
    model's own logits, and must not move when only the rows of the step are renumbered."""
    config = model.config
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    block_size, lens = 4, (5, 3)
    num_blocks = sum(-(-n // block_size) for n in lens)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_caches = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
    v_caches = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
    tables, slots, positions, next_block = [], [], [], 0
    for n in lens:
        table = list(range(next_block, next_block + -(-n // block_size)))
        next_block += len(table)
        tables.append(table + [0] * (2 - len(table)))
        slots.extend(table[p // block_size] * block_size + p % block_size for p in range(n))
        positions.extend(range(n))
    calls: list[int] = []
    meta = attention.StepMeta(
        torch.tensor(slots, dtype=torch.int64, device=device), torch.tensor(tables, dtype=torch.int32, device=device),
        torch.tensor(lens, dtype=torch.int32, device=device), torch.tensor([0, lens[0], sum(lens)], dtype=torch.int32,
                                                                           device=device),
        k_caches, v_caches, ops, calls=calls,
    )
    vocab = getattr(config, "vocab_size", 2) or 2
    ids = [(7 * i + 3) % vocab for i in range(sum(lens))]
    try:
        with torch.inference_mode(), attention.active_step(meta):
            model(input_ids=torch.tensor([ids], device=device), position_ids=torch.tensor([positions], device=device),
                  use_cache=False)
    except attention.UnsupportedAttention as e:
        raise refuse(config, str(e)) from None
    except UnsupportedModel:
        raise
    except Exception as e:  # noqa: BLE001 - any failure of the probe is the model's, said in one line
        raise refuse(config, f"its forward fails on metroline's paged attention ({one_line(e)})") from None
    if sorted(calls) != list(range(num_layers)):
        missing = sorted(set(range(num_layers)) - set(calls))
        cause = (f"layers {missing} never called the registered attention" if missing
                 else f"the attention was called {len(calls)} times for {num_layers} layers")
        raise refuse(config, f"attention does not go through transformers' AttentionInterface ({cause})")
    written = torch.tensor(slots, device=device)
    for layer in range(num_layers):
        if not k_caches[layer].view(-1, num_kv_heads * head_dim)[written].abs().sum(-1).gt(0).all():
            raise refuse(config, f"layer {layer}'s attention did not write its keys into the paged cache")
    try:
        cause = parity_probe.check(model, num_layers, num_kv_heads, head_dim, ops)
    except attention.UnsupportedAttention as e:
        raise refuse(config, str(e)) from None
    except Exception as e:  # noqa: BLE001 - as above
        raise refuse(config, f"its forward fails on metroline's paged attention ({one_line(e)})") from None
    if cause is not None:
        raise refuse(config, cause)
