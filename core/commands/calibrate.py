"""`metroline calibrate`: time a real model over batch shapes and fit the simulator's cost model."""

from __future__ import annotations

import argparse

from .options import fit_config, make_executor


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Fit the calibrated cost model to the model of `args`; write it to `args.out`."""
    from ...executors.calibrate import calibrate

    options = {"model": args.model, "dtype": args.dtype, "device": args.device, "kv_memory_gb": args.kv_memory_gb,
               "threads": args.threads}
    executor = make_executor({"executor": "torch", **options})
    fields = {k: getattr(args, k) for k in ("num_blocks", "block_size") if getattr(args, k) is not None}
    from ..config import EngineConfig

    config = fit_config(EngineConfig.model_validate(fields), executor, set(fields))
    try:
        calibrate(executor, config, args.out, repeats=args.repeats, quick=args.quick, log=print)
    finally:
        executor.close()
    return 0
