"""The roofline cost model against every profiled shape Vidur measured (`../shared/profiles/vidur`):
per profile file and tensor-parallel degree, the error of a forward without attention (every
layer's token-wise operators: `tests/test_default_cost_model.py`'s comparison, per layer) over all
the profiled token counts, with the default parameters and with (flops_efficiency,
bandwidth_efficiency, layer_overhead) fitted on the tensor-parallel-1 rows of the GPU's files
(the 70B TP2/4/8 rows held out); and the ring all-reduce term against the measured NVLink
all-reduces.

Run:  python bench/cost_model_parallel.py [--profiles ../shared/profiles/vidur]
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np

from metroline.executors.cost_models import GPU_PRESETS, MODEL_PRESETS, RooflineCostModel

OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
       "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
FILES = [("a100_Meta-Llama-3-8B_mlp.csv", "llama-3-8b", "A100"), ("a100_Llama-2-7b-hf_mlp.csv", "llama-2-7b", "A100"),
         ("h100_Llama-2-7b-hf_mlp.csv", "llama-2-7b", "H100"), ("h100_Llama-2-70b-hf_mlp.csv", "llama-2-70b", "H100")]


def layer_rows(path: Path) -> dict[tuple[int, int], float]:
    """(tensor parallel, tokens) -> the median over the file's rows of one layer's summed operator medians, in s."""
    found: dict[tuple[int, int], list[float]] = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            key = (int(r["num_tensor_parallel_workers"]), int(r["num_tokens"]))
            found.setdefault(key, []).append(sum(float(r[f"time_stats.{op}.median"]) for op in OPS) / 1e3)
    return {k: float(np.median(v)) for k, v in found.items()}


def predicted_layer_s(model: str, gpu: str, tp: int, tokens: np.ndarray, fe: float, be: float, c: float) -> np.ndarray:
    """The roofline's time of one layer's matmuls for `tokens` (vectorised over tokens), plus `c`."""
    shape, g = MODEL_PRESETS[model], GPU_PRESETS[gpu]
    flops = 2.0 * shape.layer_params * tokens / tp
    weights = shape.layer_params * shape.bytes_per_param / tp
    return np.maximum(flops / (g.flops * fe), weights / (g.bandwidth * be)) + c


def fit(points: list[tuple[str, str, int, np.ndarray, np.ndarray]]) -> tuple[float, float, float]:
    """(fe, be, c) minimising median + p90 of |relative error| over `points` (a grid search)."""
    best = None
    for c in np.arange(0.0, 161e-6, 8e-6):
        for fe in np.arange(0.40, 1.001, 0.02):
            for be in np.arange(0.50, 1.001, 0.02):
                err = np.abs(np.concatenate([predicted_layer_s(m, g, tp, n, fe, be, c) / y - 1 for m, g, tp, n, y in points]))
                score = np.median(err) + np.quantile(err, 0.9)
                if best is None or score < best[0]:
                    best = (score, float(fe), float(be), float(c))
    return best[1], best[2], best[3]


def summary(err: np.ndarray) -> str:
    a = np.abs(err)
    return f"median {np.median(a):5.1%}  p90 {np.quantile(a, 0.9):5.1%}  max {a.max():5.1%}  ({a.size} shapes)"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profiles", default="../shared/profiles/vidur")
    folder = Path(p.parse_args().profiles)
    data = {}
    for name, model, gpu in FILES:
        rows = layer_rows(folder / name)
        for tp in sorted({k[0] for k in rows}):
            n = np.array(sorted(k[1] for k in rows if k[0] == tp), dtype=float)
            data[name, model, gpu, tp] = (n, np.array([rows[tp, int(x)] for x in n]))
    default = RooflineCostModel().config
    fitted = {}
    for gpu in ("A100", "H100"):
        train = [(m, g, tp, n, y) for (_, m, g, tp), (n, y) in data.items() if g == gpu and tp == 1]
        fitted[gpu] = fit(train)
        print(f"{gpu}: fitted on the TP1 rows: flops_efficiency {fitted[gpu][0]:.2f}, bandwidth_efficiency "
              f"{fitted[gpu][1]:.2f}, layer_overhead {fitted[gpu][2] * 1e6:.0f} us")
    print("\n| profile | TP | defaults | fitted on TP1 |\n| --- | --- | --- | --- |")
    for (name, model, gpu, tp), (n, y) in data.items():
        d = predicted_layer_s(model, gpu, tp, n, default.flops_efficiency, default.bandwidth_efficiency, 0.0) / y - 1
        f = predicted_layer_s(model, gpu, tp, n, *fitted[gpu]) / y - 1
        print(f"| {name} | {tp} | {summary(d)} | {summary(f)} |")
    ar = folder / "h100_pairwise_nvlink_all_reduce.csv"
    if ar.exists():
        with open(ar, newline="") as fh:
            rows = list(csv.DictReader(fh))
        model = RooflineCostModel(node="DGX-H100").config
        for t in (2, 4):
            sel = [r for r in rows if int(r["num_workers"]) == t]
            size = np.array([float(r["size"]) for r in sel]) * 2  # bf16 elements -> bytes
            meas = np.array([float(r["time_stats.all_reduce.median"]) for r in sel]) / 1e3
            ring = 2 * (t - 1) / t * size
            pred = model.link_latency + ring / model.link_bandwidth
            slope, latency = np.polyfit(ring, meas, 1)  # the link this file's GPUs had
            own = latency + ring * slope
            print(f"all-reduce over {t} H100s ({len(sel)} sizes): DGX-H100 preset {summary(pred / meas - 1)}; "
                  f"fitted link {1 / slope / 1e9:.0f} GB/s, {latency * 1e6:.1f} us: {summary(own / meas - 1)}")


if __name__ == "__main__":
    main()
