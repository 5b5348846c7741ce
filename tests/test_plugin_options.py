"""Plugin options declared in one place (`metroline.core.plugins.options`): every shipped plugin declares an
`Options` model; a value past one of its declared limits, an unknown key, or a bad value given to the
class directly is refused in the one format `plugin 'NAME': option 'FIELD': PROBLEM (got VALUE)`; a
user plugin without a model still gets its raw table; `metroline plugins` lists every option.

The bad values are derived from each model's declared limits (`ge`, `gt`, `le`, `lt`, on a field or
on the values of a `{tenant: value}` table), so a limit added to any plugin is tested here."""

from __future__ import annotations

import inspect
import sys
import textwrap
import typing

import annotated_types
import pytest
from pydantic import BaseModel, ValidationError

from metroline import cli
from metroline.core.config import EngineConfig
from metroline.core.errors import PluginLoadError
from metroline.core.plugins.manager import SHIPPED, PluginManager, resolve
from metroline.core.plugins.options import PluginOptionsError, options_model

PLUGINS = {name: resolve(name) for name in SHIPPED}


def fields_of(name):
    """The option fields a shipped plugin declares (none when it declares no model, which
    `test_every_shipped_plugin_declares_documented_options` reports)."""
    model = options_model(PLUGINS[name])
    return model.model_fields if model is not None else {}


PHRASES = {
    annotated_types.Ge: ("ge", "greater than or equal to", -1),
    annotated_types.Gt: ("gt", "greater than", 0),
    annotated_types.Le: ("le", "less than or equal to", 1),
    annotated_types.Lt: ("lt", "less than", 0),
}
"""A limit's kind: its attribute, pydantic's phrase for it, and the step from the limit to a value
that breaks it (the limit itself breaks a strict one)."""


def number_type(annotation):
    """`int` or `float`, the number type inside `annotation` (an Optional or Annotated one too)."""
    if typing.get_origin(annotation) is typing.Annotated:
        return number_type(typing.get_args(annotation)[0])
    for arg in (annotation, *typing.get_args(annotation)):
        if arg in (int, float):
            return arg
        if typing.get_origin(arg) is typing.Annotated:
            return number_type(arg)
    raise AssertionError(f"no number type in {annotation}")


def limits_of(metadata):
    for item in metadata:
        if type(item) in PHRASES:
            yield item
        yield from limits_of(getattr(item, "metadata", []))  # a Field(...) inside Annotated


def limit_cases():
    """(plugin, option path, bad value, expected message) for every declared limit of every
    shipped plugin's options."""
    cases = []
    for name in PLUGINS:
        for field_name, field in fields_of(name).items():
            found = [((field_name,), field.annotation, limit) for limit in limits_of(field.metadata)]
            for arg in typing.get_args(field.annotation):  # an `Annotated[...] | None`
                if typing.get_origin(field.annotation) is not dict and typing.get_origin(arg) is typing.Annotated:
                    found += [((field_name,), arg, limit) for limit in limits_of(typing.get_args(arg)[1:])]
            if typing.get_origin(field.annotation) is dict:  # {tenant: value} tables
                value_type = typing.get_args(field.annotation)[1]
                found += [((field_name, "alpha"), value_type, limit) for limit in limits_of(typing.get_args(value_type))]
            for path, annotation, limit in found:
                attr, phrase, step = PHRASES[type(limit)]
                bound = getattr(limit, attr)
                bad = number_type(annotation)(bound + step)
                shown = int(bound) if float(bound).is_integer() else bound
                message = (
                    f"plugin '{name}': option '{'.'.join(path)}': Input should be {phrase} {shown} (got {bad!r})"
                )
                cases.append(pytest.param(name, path, bad, message, id=f"{name}-{'.'.join(path)}-{attr}"))
    return cases


def table(path, value):
    """The options table that sets `path` (a field, or a field and a key of its table) to `value`."""
    return {path[0]: value} if len(path) == 1 else {path[0]: {path[1]: value}}


def load(name, options):
    return PluginManager(EngineConfig(policy=name, plugin_options={name: options}))


# --- every shipped plugin declares its options ---------------------------------------------------


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_plugin_declares_documented_options(name):
    model = options_model(PLUGINS[name])
    assert model is not None, f"{name} declares no Options model"
    assert inspect.getdoc(model), f"{name}.Options has no docstring"
    for field_name, field in model.model_fields.items():
        assert field.description, f"{name}: option {field_name!r} has no description"


def test_every_plugin_with_options_has_a_limit_tested():
    with_options = {name for name in PLUGINS if fields_of(name)}
    tested = {case.values[0] for case in limit_cases()}
    assert with_options and with_options <= tested


# --- a value past a declared limit ----------------------------------------------------------------


@pytest.mark.parametrize("name, path, bad, message", limit_cases())
def test_a_value_past_a_limit_names_plugin_option_and_limit(name, path, bad, message):
    with pytest.raises(PluginOptionsError) as info:
        load(name, table(path, bad))
    assert str(info.value) == message
    assert info.value.plugin == name and info.value.problems[0][0] == ".".join(path)
    with pytest.raises(PluginOptionsError) as direct:  # built directly, the same check and message
        PLUGINS[name](**table(path, bad))
    assert str(direct.value) == message


def test_several_bad_options_are_all_named():
    with pytest.raises(PluginLoadError) as info:
        load("srpt", {"max_wait_s": -1, "prefill_weight": "x"})
    assert str(info.value) == (
        "plugin 'srpt': option 'max_wait_s': Input should be greater than or equal to 0 (got -1); "
        "option 'prefill_weight': Input should be a valid number (got 'x')"
    )


@pytest.mark.parametrize("value", [True, "1", float("nan")])
def test_types_are_strict(value):
    # a bool is not a number, a string is not one, and a number must be finite
    with pytest.raises(PluginOptionsError, match=r"^plugin 'priority': option 'aging_rate': Input should be"):
        load("priority", {"aging_rate": value})


def test_a_cross_field_rule_names_the_option_it_checks():
    with pytest.raises(PluginOptionsError, match=r"^plugin 'weighted_budget': option 'capacity': must be at least w_prefill"):
        load("weighted_budget", {"w_prefill": 2.0, "w_decode": 1.0, "capacity": 1.5})


# --- unknown keys ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SHIPPED)
def test_an_unknown_key_lists_the_valid_ones(name):
    assert options_model(PLUGINS[name]) is not None, f"{name} declares no Options model"
    fields = list(fields_of(name))
    with pytest.raises(PluginOptionsError) as info:
        load(name, {"zzz_unknown": 1})
    listed = f"valid options: {', '.join(fields)}" if fields else "the plugin takes no options"
    assert str(info.value) == f"plugin '{name}': option 'zzz_unknown': unknown option ({listed})"


@pytest.mark.parametrize("name", [n for n in SHIPPED if fields_of(n)])
def test_a_misspelt_key_gets_a_did_you_mean(name):
    field = max(fields_of(name), key=len)
    with pytest.raises(PluginOptionsError, match=f"option '{field[:-1]}': unknown option; did you mean '{field}'\\?"):
        load(name, {field[:-1]: 1})


def test_options_for_a_plugin_that_is_not_loaded_suggest_a_loaded_one():
    with pytest.raises(PluginLoadError, match=r"plugin_options.srtp: no plugin 'srtp' is loaded; did you mean 'srpt'\?"):
        PluginManager(EngineConfig(policy="srpt", plugin_options={"srtp": {"max_wait_s": 1}}))


# --- what the plugin gets ---------------------------------------------------------------------------


def test_the_plugin_gets_the_validated_frozen_options():
    pm = load("srpt", {"max_wait_s": 2, "prior_output_tokens": 7})
    srpt = pm.get("srpt")
    assert isinstance(srpt.options, srpt.Options)
    assert srpt.options == srpt.Options(max_wait_s=2.0, prior_output_tokens=7)
    assert type(srpt.options.max_wait_s) is float  # an int given for a float option arrives as a float
    with pytest.raises(ValidationError):
        srpt.options.max_wait_s = 5.0


def test_built_directly_by_keyword_by_position_or_from_options():
    cls = PLUGINS["weighted_budget"]
    by_name = cls(w_prefill=2.0, w_decode=1.0, capacity=100.0)
    by_position = cls(2.0, 1.0, 100.0)
    assert by_name.options == by_position.options
    assert cls(by_name.options).options is by_name.options
    with pytest.raises(PluginOptionsError, match="option 'w_prefill': given twice"):
        cls(2.0, w_prefill=3.0)
    with pytest.raises(PluginOptionsError, match="takes at most 4 positional options, got 5"):
        cls(1, 2, 3, 4, 5)


USER_MODULE = '''
from pydantic import BaseModel, ConfigDict, Field

from metroline.core.plugins.hookspecs import hookimpl
from metroline.policies.fcfs import FCFS


class Raw:
    """Declares no Options model: gets its table as keyword arguments, unvalidated."""

    name = "raw"

    def __init__(self, **options):
        self.raw = options

    @hookimpl
    def on_arrival(self, seqs):
        pass


class Declared:
    """Declares its options with a plain pydantic model."""

    name = "declared"

    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid")
        window: int = Field(default=4, ge=1, description="how far to look")

    def __init__(self, options):
        self.options = options

    @hookimpl
    def on_arrival(self, seqs):
        pass


class Tagged(FCFS):
    """A subclass of a shipped plugin with an `__init__` of its own and no model of its own."""

    name = "tagged"

    def __init__(self, tag="x"):
        super().__init__()
        self.tag = tag


class Inherits(FCFS):
    """A subclass that keeps its parent's `__init__`, and so its parent's model."""

    name = "inherits"
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "mtl_user_options.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "mtl_user_options"
    sys.modules.pop("mtl_user_options", None)


def test_a_user_plugin_without_a_model_still_gets_its_dict(user_module):
    table_ = {"anything": [1, 2], "nested": {"x": 1.5}, "flag": True}
    pm = PluginManager(EngineConfig(plugins=[f"{user_module}:Raw"], plugin_options={"raw": table_}))
    assert pm.get("raw").raw == table_


def test_a_user_plugin_with_a_model_gets_the_validated_object_and_the_one_format(user_module):
    spec = f"{user_module}:Declared"
    plugin = PluginManager(EngineConfig(plugins=[spec], plugin_options={"declared": {"window": 9}})).get("declared")
    assert isinstance(plugin.options, plugin.Options) and plugin.options.window == 9
    with pytest.raises(PluginOptionsError) as info:
        PluginManager(EngineConfig(plugins=[spec], plugin_options={"declared": {"window": 0}}))
    assert str(info.value) == "plugin 'declared': option 'window': Input should be greater than or equal to 1 (got 0)"
    with pytest.raises(PluginOptionsError, match=r"option 'windw': unknown option; did you mean 'window'\? \(valid options: window\)"):
        PluginManager(EngineConfig(plugins=[spec], plugin_options={"declared": {"windw": 3}}))


def test_a_subclass_with_its_own_init_gets_its_dict_one_without_keeps_the_model(user_module):
    pm = PluginManager(EngineConfig(policy=f"{user_module}:Tagged", plugin_options={"tagged": {"tag": "y"}}))
    assert pm.get("tagged").tag == "y"
    with pytest.raises(PluginOptionsError, match=r"^plugin 'inherits': option 'tag': unknown option \(the plugin takes no options\)$"):
        PluginManager(EngineConfig(policy=f"{user_module}:Inherits", plugin_options={"inherits": {"tag": "y"}}))


def test_options_under_both_the_name_and_the_spec_are_an_error(user_module):
    spec = f"{user_module}:Raw"
    with pytest.raises(PluginLoadError, match=f"options given under both 'raw' and '{spec}'"):
        PluginManager(EngineConfig(plugins=[spec], plugin_options={"raw": {"a": 1}, spec: {"a": 2}}))


# --- metroline plugins ----------------------------------------------------------------------------


def test_metroline_plugins_hides_the_defaults_internal_constructor_argument(capsys):
    assert cli.main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "defaults " in out and "sampler_class" not in out


def test_metroline_plugins_lists_every_option_with_type_default_and_description(tmp_path, capsys):
    config = tmp_path / "srpt.toml"
    config.write_text('policy = "srpt"\n\n[plugin_options.srpt]\nmax_wait_s = 2\n')
    assert cli.main(["plugins", "--config", str(config)]) == 0
    lines = [line.strip() for line in capsys.readouterr().out.splitlines()]
    assert any(line.startswith("max_wait_s = 2.0 (float >= 0 | None, default None): ") for line in lines)
    for name in PLUGINS:
        for field_name, field in fields_of(name).items():
            default = field.default_factory() if field.default_factory is not None else field.default
            rows = [line for line in lines if line.startswith((f"{field_name} (", f"{field_name} = "))]
            assert any(f"default {default!r}): {field.description}" in row for row in rows), (name, field_name)
