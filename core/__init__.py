"""The core: requests and the step, the plugin machinery, workloads, experiments and results.

| folder | holds |
| --- | --- |
| `step/` | the step: `Engine`, the scheduler and its phases, `StepPlan`, `StepContext` |
| `requests/` | `Request`, `SamplingParams`, `Sequence`, sampling rules, log-probabilities, text |
| `plugins/` | the hook specification, the plugin manager and loader, what hooks answer with |
| `workloads/` | workloads from specs, generators and traces |
| `experiments/` | replaying workloads (in parallel, on Ray), sweeps, SLOs, manifests |
| `results/` | metrics, summaries, statistics, result documents, reports |
| `conformance/` | the conformance suite behind `metroline.testing` |
| `serving/`, `commands/`, `ab_report/` | the HTTP server, the CLI's commands, comparison reports |

`config.py` (`EngineConfig`, `presets.toml`), `errors.py` and `diagnostics.py` are what every part
shares. The modules' old paths (`metroline.core.engine`, ...) keep working (`moved.py`).
"""

from . import moved

moved.install()
