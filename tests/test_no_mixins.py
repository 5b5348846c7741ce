"""No mixins sharing private state in the core: the engine, the scheduler and the HTTP front hold
their parts as objects they call (`Engine.intake`, the reaper, the scheduler's phases under
`metroline.core.step`, `Front.pages`), so no class of `core/` is composed of several bases. Read
from the source with `ast`, so a class that no test imports is checked too."""

from __future__ import annotations

import ast
from pathlib import Path

from metroline.core.serving.front import Front
from metroline.core.step.engine import Engine
from metroline.core.step.scheduler import Scheduler

CORE = Path(__file__).resolve().parent.parent / "core"


def core_classes() -> dict[str, ast.ClassDef]:
    """`file:Class` -> its definition, for every class of `core/`."""
    found = {}
    for path in sorted(CORE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                found[f"{path.relative_to(CORE)}:{node.name}"] = node
    return found


def test_no_class_of_the_core_is_composed_of_several_of_its_classes_or_is_a_mixin():
    classes = core_classes()
    own = {name.split(":")[1] for name in classes}
    composed = {}
    for name, node in classes.items():
        bases = [ast.unparse(b).split(".")[-1] for b in node.bases]
        if sum(b in own for b in bases) > 1:
            composed[name] = bases
    assert len(classes) > 100 and {"Engine", "Scheduler", "Intake", "Reaper", "FrontPages"} <= own
    assert composed == {}
    mixins = [name for name, node in classes.items() if "mixin" in (ast.get_docstring(node) or "").lower()]
    assert mixins == []


def test_the_engine_scheduler_and_front_have_no_base_and_hold_their_parts():
    assert Engine.__bases__ == Scheduler.__bases__ == Front.__bases__ == (object,)
    engine = Engine()
    assert engine.intake.requests == {}
    rid = engine.add_request({"prompt_token_ids": [1, 2, 3], "sampling": {"max_new_tokens": 2}})
    assert list(engine.intake.requests) == [rid] and engine.sequences(rid) == engine.intake.requests[rid]
    assert engine.abort(rid) and engine.intake.requests[rid][0].is_finished
    assert [(o.request_id, o.finished) for o in engine.step()] == [(rid, True)]
