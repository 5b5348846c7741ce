"""The conformance suite plugin authors run (`metroline.testing.check_plugin`): its workloads
(`workloads.py`), the checks of each run (`checks.py`) and which hooks ran and changed an answer
(`hook_coverage.py`).
"""
