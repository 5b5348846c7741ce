"""Boundary and referee cases of one scheduler step (`metroline.core.step`) and of the core's
no-livelock rule (`metroline.core.plugins.preemption`), each pinning one behaviour exactly: a
change of one comparison, count or guard in those modules fails one of them (bench/mutate.py,
bench/mutation.toml)."""

from __future__ import annotations

import pytest
from conftest import assert_pool_drained, make_engine, request, run_to_end

from metroline.core.errors import PluginError
from metroline.core.plugins.hookspecs import hookimpl


class Twice:
    """`order_running` listing the first running sequence twice."""

    name = "twice"

    @hookimpl
    def order_running(self, running):
        return [running[0], *running]


def test_an_order_running_answer_listing_a_sequence_twice_is_refused():
    # the hook's answer is a permutation or subset of `running`: a sequence listed twice would be
    # served twice in one step (its tokens scheduled twice, its blocks grown twice)
    engine = make_engine(plugins=[Twice()])
    engine.add_request(request("A", 4, max_new=4))
    engine.add_request(request("B", 4, max_new=4))
    engine.step()  # admission; order_running is asked once something runs
    with pytest.raises(PluginError) as info:
        engine.step()
    assert (info.value.plugin, info.value.hook) == ("twice", "order_running")
    assert "is listed twice" in info.value.problem
