"""`metroline replay FILE`: rerun the command a result document's manifest records and say whether
the new document matches it.

A simulated run is a function of its inputs, so the rerun's document must equal the original byte
for byte once the wall-clock fields (`manifest.WALL_CLOCK_KEYS`) are left out of both. When it does
not, the differences are listed, with what changed in between that could explain them: the
metroline version or commit, a package, a plugin's source, the workload's file.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .manifest import WALL_CLOCK_KEYS

MAX_LISTED = 20
"""At most this many differences are listed."""


def without_wall_clock(doc: Any) -> Any:
    """`doc` without the keys of `WALL_CLOCK_KEYS`, at any depth."""
    if isinstance(doc, dict):
        return {k: without_wall_clock(v) for k, v in doc.items() if k not in WALL_CLOCK_KEYS}
    if isinstance(doc, list):
        return [without_wall_clock(v) for v in doc]
    return doc


def canonical(doc: Any) -> bytes:
    """The bytes a document is compared by: as `write_json` writes it, wall-clock fields left out."""
    return json.dumps(without_wall_clock(doc), indent=2, allow_nan=False).encode()


def leaves(doc: Any, path: str = "", out: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every value of a JSON document that is not a non-empty dict or list, by its path
    (`.runs[0].summary.completed`)."""
    out = {} if out is None else out
    if isinstance(doc, dict) and doc:
        for k, v in doc.items():
            leaves(v, f"{path}.{k}", out)
    elif isinstance(doc, list) and doc:
        for i, v in enumerate(doc):
            leaves(v, f"{path}[{i}]", out)
    else:
        out[path] = doc
    return out


def differences(a: Any, b: Any) -> list[str]:
    """Where `a` and `b` differ, as `path: before -> after` lines (the first `MAX_LISTED`)."""
    before, after = leaves(a), leaves(b)
    out = []
    for path in [*before, *(p for p in after if p not in before)]:
        if path not in after:
            out.append(f"{path}: only in the original")
        elif path not in before:
            out.append(f"{path}: only in the replay")
        elif before[path] != after[path] or type(before[path]) is not type(after[path]):
            out.append(f"{path}: {before[path]!r:.80} -> {after[path]!r:.80}")
        if len(out) >= MAX_LISTED:
            break
    return out


def changed_inputs(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What differs between two manifests that could change a result: code, packages, plugins'
    sources, the workload's file and requests."""
    notes = []
    for key in ("metroline", "python", "platform"):
        if old.get(key) != new.get(key):
            notes.append(f"{key}: {json.dumps(old.get(key))} then, {json.dumps(new.get(key))} now")
    old_pkgs, new_pkgs = old.get("packages", {}), new.get("packages", {})
    for name in sorted(set(old_pkgs) | set(new_pkgs)):
        if old_pkgs.get(name) != new_pkgs.get(name):
            notes.append(f"package {name}: {old_pkgs.get(name)} then, {new_pkgs.get(name)} now")
    new_plugins = {p["spec"]: p for p in new.get("plugins", [])}
    for p in old.get("plugins", []):
        now = new_plugins.get(p["spec"], {})
        if p.get("sha256") != now.get("sha256"):
            notes.append(f"plugin {p['spec']}: its source ({p.get('module')}) changed")
        old_imports, new_imports = p.get("imports", {}), now.get("imports", {})
        for name in sorted(set(old_imports) | set(new_imports)):
            if old_imports.get(name) != new_imports.get(name):
                what = "changed" if name in old_imports and name in new_imports else (
                    "is no longer imported" if name in old_imports else "is newly imported")
                notes.append(f"plugin {p['spec']}: module {name}, which it imports, {what}")
    for key in ("config_file", "cost_model_file"):
        if (old.get(key) or {}).get("sha256") != (new.get(key) or {}).get("sha256"):
            notes.append(f"{key.replace('_', ' ')} {(old.get(key) or {}).get('path')}: changed")
    for key in ("file_sha256", "items_sha256"):
        if old.get("workload", {}).get(key) != new.get("workload", {}).get(key):
            what = "file" if key == "file_sha256" else "requests"
            notes.append(f"workload {old.get('workload', {}).get('source')}: its {what} changed")
    return notes


@dataclass
class ReplayOutcome:
    """`identical`: the documents are byte-identical apart from wall-clock fields;
    `result_identical`: they are apart from the manifest too (the environment may differ);
    `differences`: where they differ; `changed`: inputs that changed (`changed_inputs`)."""

    identical: bool
    result_identical: bool
    differences: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)

    def describe(self, path: str | Path) -> str:
        if self.identical:
            return (f"replay of {path}: identical (byte for byte, apart from the wall-clock fields "
                    f"{', '.join(sorted(WALL_CLOCK_KEYS))})")
        lines = []
        if self.result_identical:
            lines.append(f"replay of {path}: the same result, in another environment:")
        else:
            lines.append(f"replay of {path}: DIFFERS from the original:")
            lines += [f"  {d}" for d in self.differences if not d.startswith(".manifest")]
            if self.changed:
                lines.append("what changed since, which may explain it:")
        lines += [f"  {c}" for c in self.changed]
        return "\n".join(lines)


def load_manifest(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(document, its manifest); `ValueError` when the file is not a result document with one."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not a JSON result document ({exc.msg} at line {exc.lineno})") from None
    manifest = doc.get("manifest") if isinstance(doc, dict) else None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("command", {}).get("argv"), list):
        raise ValueError(f"{path}: has no manifest with a command line to replay (written by an older metroline?)")
    return doc, manifest


def plugin_folders(manifest: dict[str, Any]) -> list[str]:
    """The folders the manifest's plugin modules were imported from (`sys_path` of its plugin
    entries, `manifest.loaded_from`), for `replay` to put on `sys.path`: a plugin loaded through
    PYTHONPATH imports again from another folder without it. `ValueError` naming the plugin, its
    module, its file and what to do when a folder is gone and the module cannot be found here
    (in the working directory, where the plugin loader looks, or on `sys.path`) either."""
    folders = []
    for entry in manifest.get("plugins", []):
        folder = entry.get("sys_path")
        if folder is None or folder in folders:
            continue
        if Path(folder).is_dir():
            folders.append(folder)
            continue
        top = str(entry["module"]).split(".")[0]
        if (Path.cwd() / top).is_dir() or (Path.cwd() / f"{top}.py").is_file() or importlib.util.find_spec(top):
            continue
        raise ValueError(f"replay: plugin {entry['spec']}: module {entry['module']!r} was loaded from {entry['file']} "
                         f"(under {folder}, which no longer exists) and cannot be imported here: put the folder "
                         f"holding {top!r} on PYTHONPATH and replay again")
    return folders


@contextlib.contextmanager
def on_sys_path(folders: list[str]) -> Iterator[None]:
    """`folders` first on `sys.path` within the block, as they were after it."""
    saved = list(sys.path)
    sys.path[:0] = [f for f in folders if f not in sys.path]
    try:
        yield
    finally:
        sys.path[:] = saved


def replay_file(path: str | Path, rerun: Callable[[list[str], Path], None]) -> ReplayOutcome:
    """Rerun the document at `path`: `rerun(argv, out)` must run the manifest's command line
    `argv` writing its result document to `out`. It runs in the manifest's folder when that still
    exists (relative workload paths then resolve as they did), with the folders its plugins were
    imported from on `sys.path` (`plugin_folders`)."""
    original, manifest = load_manifest(path)
    cwd = Path(manifest["command"].get("cwd") or ".")
    with tempfile.TemporaryDirectory(prefix="metroline-replay-") as tmp:
        out = Path(tmp) / "replay.json"
        with contextlib.chdir(cwd if cwd.is_dir() else Path.cwd()):
            with on_sys_path(plugin_folders(manifest)):
                rerun(list(manifest["command"]["argv"]), out)
        replayed = json.loads(out.read_text(encoding="utf-8"))
    identical = canonical(original) == canonical(replayed)
    result_a = {k: v for k, v in original.items() if k != "manifest"}
    result_b = {k: v for k, v in replayed.items() if k != "manifest"}
    return ReplayOutcome(
        identical=identical,
        result_identical=canonical(result_a) == canonical(result_b),
        differences=[] if identical else differences(without_wall_clock(original), without_wall_clock(replayed)),
        changed=changed_inputs(manifest, replayed.get("manifest") or {}),
    )
