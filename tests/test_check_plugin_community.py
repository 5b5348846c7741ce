"""`check_plugin` on the vLLM community's policies (`least_computed`, `residual_sjf`,
`session_affinity`): the conformance suite's chat workload passes under each, and the two that act
on any workload change the schedule (`strict=True`: a hook that never changed an answer fails)."""

from __future__ import annotations

import pytest

from metroline.core.plugins.loader import resolve
from metroline.testing import check_plugin, conformance_workloads


@pytest.mark.parametrize("name, hook", [("least_computed", "select_victim"), ("residual_sjf", "admission")])
def test_it_passes_strict_and_changes_the_schedule(name, hook):
    report = check_plugin(resolve(name), workloads=conformance_workloads()[:1], modes=("recompute",), strict=True)
    assert report.coverage[hook].changed > 0


def test_session_affinity_passes_and_says_it_found_no_session():
    report = check_plugin(resolve("session_affinity"), workloads=conformance_workloads()[:1], modes=("recompute",))
    assert report.coverage["admission"].calls > 0
    assert report.coverage["admission"].changed == 0  # the suite's requests carry no session id
    assert any("never changed an answer" in w for w in report.warnings)
