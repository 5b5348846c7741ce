"""Sphinx configuration of metroline's documentation site: the user guide, the plugin guide and the API reference.

Build (CI does, in tests/test_api_reference.py, with warnings as errors):

    sphinx-build -W -b html docs docs/_build/html

The reference is generated from the docstrings (autodoc imports the installed `metroline`); the
guides are the Markdown files beside this one (MyST). The fields of a pydantic model (`Request`,
`SamplingParams`) are not class attributes autodoc can find, so `document_model_fields` adds one
entry per field, from the model's own field table.
"""

from importlib import import_module
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective

project = "metroline"
author = "metroline contributors"
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "myst_parser"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# the docstrings write code as `name` (Markdown style): render it as code, linked when it names
# a documented object (an unresolved name is plain code, not a warning)
default_role = "py:obj"
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
napoleon_google_docstring = True
napoleon_numpy_docstring = False

myst_heading_anchors = 3  # the guide links its own sections by their titles
smartquotes = False  # quotes stay as the docstrings write them (they quote code)
html_theme = "alabaster"
html_title = "metroline"


def document_model_fields(app: Any, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    """After a pydantic model's docstring: one `py:attribute` entry per field, with its type and
    default (the field's constraints are in the type)."""
    fields = getattr(obj, "model_fields", None) if what == "class" else None
    if not isinstance(fields, dict):
        return
    from pydantic_core import PydanticUndefined

    lines.append("")
    for field_name, info in fields.items():
        annotation = getattr(info.annotation, "__name__", None) or str(info.annotation)
        lines += [f".. py:attribute:: {field_name}", f"   :type: {annotation.replace('typing.', '')}"]
        if info.default is not PydanticUndefined:
            lines.append(f"   :value: {info.default!r}")
        elif info.default_factory is not None:
            lines.append("   :value: (generated)")
        else:
            lines.append("   :value: (required)")
        lines.append("")
        if info.description:
            lines += [f"   {info.description}", ""]
        constraints = ", ".join(repr(m) for m in info.metadata)
        if constraints:
            lines += [f"   Constraints: ``{constraints}``.", ""]


class ShippedPlugins(SphinxDirective):
    """`.. shipped-plugins::`: for each plugin of `SHIPPED`, in its order, the class (its
    docstring) and its `Options` model (one entry per option), generated from the code, so a
    plugin shipped later is documented without touching api.rst."""

    def run(self) -> list[Any]:
        from metroline.core.plugins.loader import SHIPPED

        lines = []
        for name, path in SHIPPED.items():
            module, _, attr = path.partition(":")
            lines += [f".. rubric:: ``{name}``", "", f".. autoclass:: {module}.{attr}", "   :no-members:", ""]
            if "Options" in vars(import_module(module).__dict__[attr]):
                lines += [f".. autoclass:: {module}.{attr}.Options", "   :exclude-members: model_config", ""]
        container = nodes.container()
        self.state.nested_parse(StringList(lines, source="shipped-plugins"), self.content_offset, container)
        return container.children


def setup(app: Any) -> dict[str, Any]:
    app.connect("autodoc-process-docstring", document_model_fields)
    app.add_directive("shipped-plugins", ShippedPlugins)
    return {"parallel_read_safe": True}
