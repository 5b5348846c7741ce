"""The picture of one step (docs/_static/step.svg, drawn by docs/figures/step_diagram.py) names the
hooks the step calls, in the order the step protocol of the hookspecs calls them, and the hooks
outside the step, and the committed SVG names every one of them."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from metroline import api
from metroline.core.plugins import hookspecs

ROOT = Path(__file__).parents[1]
SCRIPT = ROOT / "docs" / "figures" / "step_diagram.py"


def load_script():
    spec = importlib.util.spec_from_file_location("step_diagram", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_phases_call_the_hooks_of_the_step_protocol_in_its_order():
    diagram = load_script()
    assert diagram.check() == []
    drawn = [hook for _, _, hooks in diagram.PHASES for hook in hooks]
    first_calls = list(dict.fromkeys(name for names, _ in hookspecs.STEP_PROTOCOL for name in names))
    assert list(dict.fromkeys(drawn)) == first_calls
    assert sorted(set(drawn) | {hook for hook, _ in diagram.OUTSIDE}) == sorted(api.HOOK_NAMES)


def test_a_hook_left_out_of_the_picture_is_found(monkeypatch):
    diagram = load_script()
    phases = [(p, d, tuple(h for h in hooks if h != "order_running")) for p, d, hooks in diagram.PHASES]
    monkeypatch.setattr(diagram, "PHASES", phases)
    (problem,) = diagram.check()
    assert "order_running" in problem
    monkeypatch.setattr(diagram, "OUTSIDE", diagram.OUTSIDE[:-1])
    assert any("estimate_output_tokens" in p for p in diagram.check())


def test_the_committed_svg_names_every_phase_and_hook():
    diagram = load_script()
    svg = (ROOT / "docs" / "_static" / "step.svg").read_text()
    texts = re.findall(r"<text[^>]*>([^<]*)</text>", svg)
    for phase, _, hooks in diagram.PHASES:
        assert phase in texts
        for hook in hooks:
            assert hook in texts
    for hook, when in diagram.OUTSIDE:
        assert hook in texts and when in texts
    assert texts.count("select_victim") == 2 and texts.count("on_preempted") == 2
