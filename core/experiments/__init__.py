"""Experiments: replaying workloads through engines and what is asked of the runs.

- `runner.py`: replaying one workload through one engine; `parallel.py`: several replays in worker
  processes (`compare`), `ray_runner.py` the same as Ray tasks (`--ray`);
- `run_series.py`: a run's records and step log over time; `slo.py`: SLO checks and goodput;
- `sweep.py`: load sweeps and capacity at SLO; `load_check.py`: too light or too heavy to compare
  (`load_guidance.py`: the comparisons page's guidance, generated from it);
- `manifest.py`: what ran; `replay_check.py`: rerun a document and compare.
"""
