"""The model's linear layers on CPU in float32: torch's own kernel or oneDNN on prepacked weights,
chosen by the number of rows a call multiplies.

torch's CPU `linear` goes to MKL, which on some CPUs (AMD EPYC with AVX-512, for one) picks a
kernel that reaches half of what oneDNN reaches on the same core once a call has a few rows; with
one row (a lone decode, the LM head on one sampled row) MKL's matrix-vector kernel streams the
weights faster than oneDNN's packed one. `install(model)` gives every float32 `nn.Linear` a forward
that, while a metroline step runs (`active()`), multiplies calls of at least `min_rows()` rows
with oneDNN on a copy of the weight reordered once into oneDNN's blocked layout, and smaller ones
with `F.linear`; outside a step the layer is plain `F.linear`, so the same model object still
serves Hugging Face `generate` unchanged. Results are float32 (no reduced-precision math), equal
to `F.linear` up to summation order. A call's kernel depends on its row count alone, so the
deterministic mode's fixed 32-row tiles always take one kernel.

The crossover is measured on the machine (`calibrate`: the model's own layers, one pass over all
of them per row count and kernel, alternating, the best of a few), once per CPU, torch version,
thread count and set of layer shapes, and cached as JSON under `$METROLINE_CACHE`
(`linear-rows.json`); `METROLINE_LINEAR_MIN_ROWS=N` sets it instead (1: always oneDNN).

The packed copy is taken at `install`, of the weights the layers hold then: weights changed or
replaced afterwards are not seen.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

PACK_BATCH_HINT = 64
"""The batch size oneDNN's weight layout is chosen for (any batch size works with it)."""
ROW_COUNTS = (1, 2, 4, 8, 16)
"""The row counts `calibrate` times; past the last, oneDNN is taken (it wins there on every CPU
measured, and the prepacked layout is made for 64 rows)."""
MIN_ROWS_ENV = "METROLINE_LINEAR_MIN_ROWS"

_active = False
_min_rows = 1  # calls of at least this many rows (inside a step) take oneDNN


def available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether `install` applies: a CPU float32 model and a torch built with oneDNN."""
    return (
        device.type == "cpu" and dtype == torch.float32 and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


class PackedForward:
    """The forward of one `nn.Linear`: inside a step, oneDNN on the packed weight for calls of at
    least `min_rows()` rows and `F.linear` for fewer; `F.linear` outside a step.

    It holds the layer's weight and bias, not the layer (which holds it: no reference cycle)."""

    __slots__ = ("weight", "bias", "packed")

    def __init__(self, linear: torch.nn.Linear) -> None:
        self.weight = linear.weight
        self.bias = linear.bias
        with torch.no_grad():
            self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), PACK_BATCH_HINT)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if _active and x.numel() >= _min_rows * x.shape[-1]:
            return self.onednn(x)
        return F.linear(x, self.weight, self.bias)

    def onednn(self, x: torch.Tensor) -> torch.Tensor:
        """oneDNN on the packed weight, whatever the row count."""
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def install(model: Any) -> int:
    """Give every float32 CPU `nn.Linear` of `model` a `PackedForward`; returns how many."""
    count = 0
    for module in model.modules():
        if type(module) is torch.nn.Linear and module.weight.dtype == torch.float32 and module.weight.device.type == "cpu":
            if not isinstance(module.__dict__.get("forward"), PackedForward):
                module.forward = PackedForward(module)
            count += 1
    return count


def forwards(model: Any) -> list[PackedForward]:
    """The installed forwards of `model`'s layers, in module order."""
    return [f for m in model.modules() if isinstance(f := m.__dict__.get("forward"), PackedForward)]


def min_rows() -> int:
    """The fewest rows a call inside a step multiplies with oneDNN (fewer: `F.linear`)."""
    return _min_rows


def set_min_rows(rows: int) -> None:
    """Set `min_rows()` (process-wide: every installed layer); at least 1."""
    global _min_rows
    if rows < 1:
        raise ValueError(f"linear min_rows: {rows} (at least 1)")
    _min_rows = int(rows)


def crossover(timings: dict[int, tuple[float, float]]) -> int:
    """The fewest rows from which oneDNN is taken, given `{rows: (torch seconds, oneDNN seconds)}`:
    the smallest measured row count from which oneDNN is no slower at it and at every larger one
    measured; one past the largest when torch wins there."""
    rows = sorted(timings)
    choice = rows[-1] * 2 if rows else 1
    for r in reversed(rows):
        plain, packed = timings[r]
        if packed > plain:
            break
        choice = r
    return choice


def measure(layers: list[PackedForward], row_counts: tuple[int, ...] = ROW_COUNTS,
            repeats: int = 3) -> dict[int, tuple[float, float]]:
    """`{rows: (torch, oneDNN)}`: the CPU seconds of one pass over `layers` (as a forward meets
    them, so weights stream from memory as they do in a step) per kernel, the best of `repeats`
    alternating passes."""
    timings = {}
    with torch.inference_mode():
        for rows in row_counts:
            inputs = [torch.randn(1, rows, f.weight.shape[1]) for f in layers]
            best = [float("inf"), float("inf")]
            for _ in range(repeats):
                for k, kernel in enumerate((lambda f, x: F.linear(x, f.weight, f.bias), PackedForward.onednn)):
                    start = time.process_time()
                    for f, x in zip(layers, inputs):
                        kernel(f, x)
                    best[k] = min(best[k], time.process_time() - start)
            timings[rows] = (best[0], best[1])
    return timings


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cache_key(layers: list[PackedForward]) -> str:
    """What a measured crossover depends on: CPU, torch version, threads and the layers' shapes."""
    shapes = sorted({tuple(f.weight.shape) for f in layers})
    text = f"{_cpu_name()}|{torch.__version__}|{torch.get_num_threads()}|{shapes}"
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def calibrate(model: Any, cache_dir: Path | None = None) -> int:
    """Set `min_rows()` for `model`'s installed layers: `$METROLINE_LINEAR_MIN_ROWS` when set, else
    the cached crossover for this CPU, torch, thread count and shapes, else `measure` it (and cache
    it). Returns it."""
    text = os.environ.get(MIN_ROWS_ENV)
    if text:
        try:
            rows = int(text)
        except ValueError:
            raise ValueError(f"{MIN_ROWS_ENV}={text!r}: not an integer") from None
        if rows < 1:
            raise ValueError(f"{MIN_ROWS_ENV}={rows}: at least 1")
        set_min_rows(rows)
        return rows
    layers = forwards(model)
    if not layers:
        return _min_rows
    if cache_dir is None:
        from .loader import cache_root

        cache_dir = cache_root()
    path = Path(cache_dir) / "linear-rows.json"
    key = cache_key(layers)
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    if not isinstance(cached, dict):
        cached = {}
    entry = cached.get(key)
    if isinstance(entry, dict) and isinstance(entry.get("min_rows"), int) and entry["min_rows"] >= 1:
        set_min_rows(entry["min_rows"])
        return entry["min_rows"]
    timings = measure(layers)
    rows = crossover(timings)
    cached[key] = {"min_rows": rows, "threads": torch.get_num_threads(), "cpu": _cpu_name(),
                   "torch": torch.__version__, "seconds": {str(r): list(t) for r, t in timings.items()}}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(cached, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass  # an unwritable cache: measured again next time
    set_min_rows(rows)
    return rows


@contextlib.contextmanager
def active() -> Iterator[None]:
    """Inside the `with` body, installed linear layers multiply with oneDNN (calls of at least
    `min_rows()` rows)."""
    global _active
    previous, _active = _active, True
    try:
        yield
    finally:
        _active = previous
