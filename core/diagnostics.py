"""One style for every error a user sees: `WHERE: KEY: problem (valid: ...)`, on one line.

WHERE is the file (and line), the command-line flag, or the plugin and hook; the command prefixes
`metroline: error: `.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ValidationError


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def validation_message(
    err: ValidationError, where: Callable[[str], str], model: type[BaseModel] | None = None
) -> str:
    """`err` as one line: each problem as `WHERE: KEY: problem`, `where(key)` naming the origin of
    the top-level key; an unknown key lists the valid ones of `model`."""
    parts = []
    for e in err.errors():
        loc = e["loc"]
        key = ".".join(str(p) for p in loc) if loc else ""
        if not loc and model is not None:  # a check across fields: name the first one it mentions
            mentioned = [(e["msg"].find(f), f) for f in model.model_fields if f in e["msg"]]
            key = min(mentioned)[1] if mentioned else ""
        origin = where(str(loc[0]) if loc else key)
        if e["type"] == "extra_forbidden":
            valid = f" (valid: {', '.join(model.model_fields)})" if model is not None else ""
            problem = f"unknown key{valid}"
        elif e["type"] == "missing":
            problem = "missing"
        else:
            msg = e["msg"]
            if msg.startswith("Value error, "):
                msg = msg[len("Value error, "):]
            problem = f"{msg[:1].lower()}{msg[1:]}"
            if e["type"] != "value_error" and loc:
                problem += f", got {_short(e['input'])}"
        parts.append(f"{origin}: {key}: {problem}" if key else f"{origin}: {problem}")
    return "; ".join(parts)
