"""Limits on a `response_format` JSON schema, checked at submission (400 naming the field) before
any grammar is compiled: a schema whose grammar would take seconds to build, or that recursion
would break, never reaches the engine.

`schema_problem(schema)` walks the schema without recursion (a schema nested thousands deep is
refused, not a `RecursionError`) and answers the first limit it breaks, or None: at most
`MAX_NODES` objects and lists in all, `MAX_DEPTH` levels of nesting, `MAX_BRANCHES` alternatives
in one `anyOf`/`oneOf`/`allOf` and `MAX_TOTAL_BRANCHES` in all, and no cycle of local `$ref`s
(`#/$defs/a` refers, directly or not, to itself).
"""

from __future__ import annotations

from typing import Any

MAX_NODES = 4096
MAX_DEPTH = 48
MAX_BRANCHES = 128
MAX_TOTAL_BRANCHES = 512
_COMBINERS = ("anyOf", "oneOf", "allOf")


def schema_problem(schema: Any) -> str | None:
    """The first limit `schema` breaks, in words, or None."""
    nodes = branches = 0
    refs: dict[str, set[str]] = {}  # JSON pointer of a subschema -> local $refs inside it
    stack: list[tuple[Any, int, str]] = [(schema, 1, "#")]
    while stack:
        node, depth, where = stack.pop()
        if not isinstance(node, (dict, list)):
            continue
        nodes += 1
        if nodes > MAX_NODES:
            return f"the schema has more than {MAX_NODES} objects and lists (limit)"
        if depth > MAX_DEPTH:
            return f"the schema is nested more than {MAX_DEPTH} levels deep (limit)"
        if isinstance(node, list):
            stack.extend((v, depth + 1, f"{where}/{i}") for i, v in enumerate(node))
            continue
        for key in _COMBINERS:
            alternatives = node.get(key)
            if isinstance(alternatives, list):
                if len(alternatives) > MAX_BRANCHES:
                    return f"{key} at {where} has {len(alternatives)} alternatives, above the limit of {MAX_BRANCHES}"
                branches += len(alternatives)
                if branches > MAX_TOTAL_BRANCHES:
                    return f"the schema has more than {MAX_TOTAL_BRANCHES} alternatives in all (limit)"
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            for prefix in _prefixes(where):
                refs.setdefault(prefix, set()).add(ref)
        stack.extend((v, depth + 1, f"{where}/{_escape(str(k))}") for k, v in node.items())
    return _ref_cycle(refs)


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _prefixes(pointer: str) -> list[str]:
    """`#/a/b` -> `#`, `#/a`, `#/a/b`: the subschemas a `$ref` at `pointer` lies inside."""
    parts = pointer.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _ref_cycle(refs: dict[str, set[str]]) -> str | None:
    """A `$ref` cycle among the local references, in words, or None (iterative depth-first)."""
    targets = {r for rs in refs.values() for r in rs}
    done: set[str] = set()
    for start in sorted(targets):
        if start in done:
            continue
        path, on_path = [start], {start}
        iters = [iter(sorted(refs.get(start, ())))]
        while iters:
            nxt = next(iters[-1], None)
            if nxt is None:
                node = path.pop()
                on_path.discard(node)
                done.add(node)
                iters.pop()
                continue
            if nxt in on_path:
                return f"$ref cycle: {' -> '.join(path[path.index(nxt):] + [nxt])} (recursive schemas are refused)"
            if nxt not in done:
                path.append(nxt)
                on_path.add(nxt)
                iters.append(iter(sorted(refs.get(nxt, ()))))
    return None
