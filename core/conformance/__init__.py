"""The conformance suite plugin authors run (`metroline.testing.check_plugin`): its workloads
(`workloads.py`), the checks of each run (`checks.py`) and which hooks ran and changed an answer
(`hook_coverage.py`); and the KV guard: a shadow model of every KV slot checked at every step
(`kv_shadow.py`) and random configurations run under it (`kv_chaos.py`, `bench/kv_chaos.py`).
"""
