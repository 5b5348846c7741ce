"""The hook table of the tenant plugins page (docs/guide/tenant-plugins.md) and of docs/plugins.md, generated from the hookspecs
(`metroline.core.plugins.hookspecs`) so that the two cannot disagree with each other or with the
code: one row per hook, its signature (the hookspec's arguments), its kind and the first sentence
of its docstring.

Each document holds the table between the markers `<!-- hook-table:start -->` and
`<!-- hook-table:end -->`. `python -m metroline.core.plugins.hook_table --write` rewrites them;
`--check` exits 1 when one differs (tests/test_hook_table.py checks it, and that every hook
signature written anywhere in those documents is the hookspec's).
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
from pathlib import Path

from . import hookspecs
from .loader import HOOK_NAMES

START, END = "<!-- hook-table:start -->", "<!-- hook-table:end -->"
DOCUMENTS = ("docs/guide/tenant-plugins.md", "docs/plugins.md")
"""The documents holding the table, relative to the repository root."""

EDGE_HOOKS = {"check_request": "edge (once per request)", "route": "cluster (once per request)"}


def signature(hook: str) -> str:
    """`name(arg, ...)`: the hookspec's arguments, as a plugin may take any subset of them."""
    return f"{hook}({', '.join(inspect.signature(getattr(hookspecs, hook)).parameters)})"


def kind(hook: str) -> str:
    if hook in EDGE_HOOKS:
        return EDGE_HOOKS[hook]
    if hook in hookspecs.OBSERVER_HOOKS:
        return "observer"
    opts = getattr(getattr(hookspecs, hook), f"{hookspecs.PROJECT}_spec", None) or {}
    return "decision" if opts.get("firstresult") or hook in hookspecs.DECISION_HOOKS else "observer"


def summary(hook: str) -> str:
    """The first sentence of the hookspec's docstring, on one line."""
    text = " ".join((inspect.getdoc(getattr(hookspecs, hook)) or "").split("\n\n")[0].split())
    match = re.match(r"(.+?[.!?])(\s|$)", text)
    return (match.group(1) if match else text).replace("|", "\\|")


def ordered_hooks() -> list[str]:
    """The decision hooks, the edge hooks, the observers (as `hookspecs` lists them), then any
    other hook."""
    first = [*hookspecs.DECISION_HOOKS, *EDGE_HOOKS, *hookspecs.OBSERVER_HOOKS]
    return [h for h in first if h in HOOK_NAMES] + sorted(set(HOOK_NAMES) - set(first))


def table() -> str:
    """The markdown table, without the markers."""
    rows = ["| hook | kind | what it answers or hears |", "| --- | --- | --- |"]
    rows += [f"| `{signature(h)}` | {kind(h)} | {summary(h)} |" for h in ordered_hooks()]
    return "\n".join(rows)


def rewritten(text: str, where: str) -> str:
    """`text` with the table between its markers replaced by the generated one."""
    if text.count(START) != 1 or text.count(END) != 1:
        raise ValueError(f"{where}: needs exactly one {START} ... {END} block")
    head, rest = text.split(START)
    _, tail = rest.split(END)
    return f"{head}{START}\n{table()}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m metroline.core.plugins.hook_table", description=__doc__)
    parser.add_argument("--write", action="store_true", help="rewrite the tables in the documents")
    parser.add_argument("--check", action="store_true", help="exit 1 when a document's table differs")
    args = parser.parse_args(argv)
    root = Path(__file__).parents[2]
    stale = []
    for name in DOCUMENTS:
        path = root / name
        text = path.read_text()
        new = rewritten(text, name)
        if new != text:
            stale.append(name)
            if args.write:
                path.write_text(new)
    if not args.write and not args.check:
        print(table())
    elif args.check and stale:
        print(f"hook tables out of date in {', '.join(stale)}: python -m metroline.core.plugins.hook_table --write")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
