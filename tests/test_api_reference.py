"""The API reference (docs/, Sphinx) builds with warnings as errors, and every public name a plugin
touches has its entry in it, with the names read from the code (a new hook, field or helper that is
not documented fails here)."""

import inspect
import re
import subprocess
import sys
from html import unescape
from pathlib import Path

import pytest

from metroline import testing
from metroline.core.plugins import budget, candidates, hookspecs, inflight, lazy_heap, preemption, queue_order, victims
from metroline.core.plugins import options as plugin_options
from metroline.core.plugins.loader import HOOK_NAMES, SHIPPED, resolve
from metroline.core.requests import request, sequence
from metroline.core.step import context, plan
from metroline.core.workloads import generators as workload_generators
from metroline.core.workloads import items as workload_items
from metroline.core.workloads import specs as workload_specs

DOCS = Path(__file__).parents[1] / "docs"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("html")
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS), str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, f"sphinx-build -W failed:\n{proc.stdout}\n{proc.stderr}"
    return out


def entries(built) -> set[str]:
    """The ids of the objects the reference documents (`module.Class.member`)."""
    html = (built / "api.html").read_text()
    return set(re.findall(r'<dt class="sig sig-object py" id="([^"]+)"', html))


def public_members(cls) -> list[str]:
    """The names an instance of `cls` shows: the public slots, fields, methods and properties of
    `cls` and of its metroline bases."""
    names = set()
    for klass in cls.__mro__:
        if klass.__module__.startswith("metroline"):
            names.update(getattr(klass, "__slots__", ()))
            names.update(vars(klass))
    return sorted(n for n in names if not n.startswith("_"))


PLUGIN_CLASSES = [
    sequence.Sequence, context.StepContext, plan.StepPlan, candidates.Candidates, budget.Split,
    preemption.Preempt, lazy_heap.LazyHeap, inflight.PromptsInFlight, testing.ConformanceReport,
]
PLUGIN_FUNCTIONS = [
    candidates.close_candidates, preemption.is_protected, lazy_heap.arrival_key, queue_order.queued_in_order,
    victims.last_admitted, victims.last_admitted_victim, inflight.missing_blocks, testing.check_plugin,
    workload_specs.load_spec, workload_generators.generate, plugin_options.take_options,
]
OTHER_NAMES = [
    lazy_heap.ArrivalQueue, testing.ConformanceError, sequence.SeqState,
    sequence.FinishReason, workload_items.Workload, plugin_options.PluginOptions, plugin_options.PluginOptionsError,
]


def qualified(obj) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


def test_the_reference_builds_without_warnings(built):
    assert (built / "api.html").is_file() and (built / "plugins.html").is_file()


def test_every_hook_is_in_the_reference(built):
    documented = entries(built)
    assert len(HOOK_NAMES) >= 13
    missing = [h for h in HOOK_NAMES if f"metroline.core.plugins.hookspecs.{h}" not in documented]
    assert not missing
    assert "metroline.core.plugins.hookspecs.hookimpl" in documented


def test_every_public_member_of_what_plugins_touch_is_in_the_reference(built):
    documented = entries(built)
    missing = []
    for cls in PLUGIN_CLASSES:
        if qualified(cls) not in documented:
            missing.append(qualified(cls))
        for name in public_members(cls):
            if f"{qualified(cls)}.{name}" not in documented:
                missing.append(f"{qualified(cls)}.{name}")
    for obj in PLUGIN_FUNCTIONS + OTHER_NAMES:
        if qualified(obj) not in documented:
            missing.append(qualified(obj))
    for name in ("requests.sequence.WAITING", "requests.sequence.RUNNING", "requests.sequence.SWAPPED",
                 "requests.sequence.FINISHED", "requests.sequence.QUEUED", "plugins.loader.ENTRY_POINT_GROUP",
                 "plugins.loader.SHIPPED"):
        if f"metroline.core.{name}" not in documented:
            missing.append(name)
    assert not missing, f"not in the API reference: {missing}"


def test_every_field_of_a_request_and_a_workload_spec_is_in_the_reference(built):
    documented = entries(built)
    models = (request.Request, request.SamplingParams, workload_specs.SyntheticSpec, workload_specs.TenantSpec,
              workload_specs.FixedLength, workload_specs.UniformLength, workload_specs.LognormalLength)
    for model in models:
        assert qualified(model) in documented
        missing = [f for f in model.model_fields if f"{qualified(model)}.{f}" not in documented]
        assert not missing, f"{model.__name__} fields not in the API reference: {missing}"


def test_the_reference_shows_the_hook_docstrings(built):
    """The hook entries carry their specs' text (what autodoc read), not only their names."""
    text = re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", "", (built / "api.html").read_text())))
    for name in HOOK_NAMES:
        first_line = inspect.getdoc(getattr(hookspecs, name)).splitlines()[0]
        plain = re.sub(r"`([^`]*)`", r"\1", first_line)
        assert plain.split()[0] in text
        assert re.sub(r"\s+", " ", plain)[:40] in text, name


def test_every_shipped_plugin_and_each_of_its_options_is_in_the_reference(built):
    documented = entries(built)
    missing = []
    for name in SHIPPED:
        cls = resolve(name)
        if qualified(cls) not in documented:
            missing.append(name)
        model = plugin_options.options_model(cls)
        if model is not None:
            missing += [f"{name}.{f}" for f in model.model_fields if f"{qualified(model)}.{f}" not in documented]
    assert not missing, f"not in the API reference: {missing}"


def test_every_name_of_the_plugin_api_is_in_the_reference(built):
    """Each class and function `metroline.api` exports has its entry, and so does each constant."""
    from metroline import api

    documented = entries(built)
    missing = []
    for name in api.__all__:
        obj = getattr(api, name)
        if isinstance(obj, type) or inspect.isroutine(obj):
            if qualified(obj) not in documented:
                missing.append(name)
        elif not any(d.endswith(f".{name}") for d in documented):
            missing.append(name)
    assert 'id="module-metroline.api"' in (built / "api.html").read_text()
    assert not missing, f"names of metroline.api not in the API reference: {missing}"
