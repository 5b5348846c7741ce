"""The manifest of a result document: what it takes to rerun it and to know whether the rerun ran
the same thing.

Every document metroline writes carries one under its top-level `manifest` key:

- `metroline`: the version, and the git commit of the checkout it ran from (with `dirty` and a
  sha256 of `git diff HEAD` when the checkout had uncommitted changes; None outside a checkout);
- `python`, `platform`, `packages`: the interpreter, the OS, and the installed version of every
  package metroline requires or offers as an extra (None when not installed);
- `command`: the command line (`argv`, after `metroline`) and the folder it ran in (`cwd`);
- `config` and `run`: the engine config and the run options, as resolved (defaults filled in);
  `config_file` and `cost_model_file`: the `--config` file and a calibrated cost model's file,
  each with its sha256, when there are;
- `plugins`: every plugin the runs load (policy, stacked plugins, the core's defaults) with its
  options, the sha256 of its module's source file and `imports`: the sha256 of every module of
  the plugin author's that it imports (`plugin_imports.imported_modules`: not the standard
  library, site-packages or metroline); for a module of the author's, `file` (its source file)
  and `sys_path` (the folder it was imported from, on PYTHONPATH or the working directory), which
  `replay` puts on `sys.path` again;
- `workload`: its name and source, the sha256 of its file (a trace or a spec: the same content
  under another name has the same hash) and of its requests (arrival, prompt segments, output
  length, tenant, priority);
- `seeds`: the seeds the run used (the engine's, the workload's);
- `started_at` (UTC) and `host`: wall-clock fields, which a replay does not compare.

Nothing here is computed on the simulated path: a manifest is made once, when a document is written.
"""

from __future__ import annotations

import hashlib
import inspect
import platform
import re
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

WALL_CLOCK_KEYS = frozenset({"wall_s", "started_at", "host"})
"""Keys of a result document whose values come from the host's clock or name the host: the only
ones a replay may change."""

PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def sha256_file(path: str | Path) -> str:
    """The sha256 of a file's bytes, in hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def git_state(root: Path = PACKAGE_ROOT) -> dict[str, Any] | None:
    """`{"commit", "dirty", "diff_sha256"}` of the checkout at `root`, or None when it is not one
    (an installed wheel) or git is missing."""
    def git(*args: str) -> bytes:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, check=True, timeout=10).stdout

    try:
        commit = git("rev-parse", "HEAD").decode().strip()
        diff = git("diff", "HEAD")
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": bool(diff), "diff_sha256": hashlib.sha256(diff).hexdigest() if diff else None}


def package_versions() -> dict[str, str | None]:
    """The installed version of each package metroline requires, extras included, by name."""
    try:
        required = metadata.requires("metroline") or []
    except metadata.PackageNotFoundError:
        required = []
    names = sorted({re.split(r"[\s;<>=!~\[(]", r, maxsplit=1)[0].lower() for r in required})
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def metroline_version() -> str:
    try:
        return metadata.version("metroline")
    except metadata.PackageNotFoundError:
        from ... import __version__

        return __version__


def plugin_entries(configs: list[Any]) -> list[dict[str, Any]]:
    """One entry per plugin spec the configs load (in order of first use), with the core's
    defaults: `{"spec", "name", "module", "sha256", "options"}`; a spec that does not resolve
    has `"error"` instead of a module and hash."""
    from ..plugins.manager import DEFAULTS_NAME, plugin_name, resolve

    entries: dict[str, dict[str, Any]] = {}
    for config in configs:
        for spec in [config.policy, *config.plugins]:
            if spec in entries:
                continue
            try:
                target = resolve(spec)
            except Exception as exc:  # noqa: BLE001 - recorded, the run reports it
                entries[spec] = {"spec": spec, "error": f"{type(exc).__name__}: {exc}"}
                continue
            name = plugin_name(target, spec)
            options = config.plugin_options.get(name, config.plugin_options.get(spec, {}))
            entries[spec] = {"spec": spec, "name": name, **source_of(target), "options": options}
    from ..plugins import defaults

    entries[DEFAULTS_NAME] = {"spec": DEFAULTS_NAME, "name": DEFAULTS_NAME, **source_of(defaults), "options": {}}
    return list(entries.values())


def source_of(target: Any) -> dict[str, Any]:
    """`{"module", "sha256"}` of the module that defines `target` (a module, class or instance),
    and `imports` (`{module: sha256}`) when it imports modules of its author's."""
    from .plugin_imports import imported_modules

    module = target if inspect.ismodule(target) else inspect.getmodule(target if inspect.isclass(target) else type(target))
    path = getattr(module, "__file__", None)
    imports = imported_modules(module) if module is not None else {}
    return {"module": getattr(module, "__name__", None), "sha256": sha256_file(path) if path else None,
            **({"imports": imports} if imports else {}), **loaded_from(module)}


def loaded_from(module: Any) -> dict[str, str]:
    """`{"file", "sys_path"}` of a plugin author's module (`plugin_imports.own_file`: not the
    standard library, an installed package or metroline): its source file and the `sys.path`
    entry its top-level package was found under (the folder on PYTHONPATH, or the working
    directory), so that `replay` can import it again from another folder; `{}` for other modules."""
    from .plugin_imports import own_file

    file = own_file(getattr(module, "__file__", None))
    if file is None:
        return {}
    depth = module.__name__.count(".") + (file.name == "__init__.py")
    return {"file": str(file), "sys_path": str(file.parents[depth])}


def workload_file(run: dict[str, Any], workload: Any) -> Path | None:
    """The file a workload was read from (a trace, a spec, a request file), if any."""
    path = workload.params.get("path") or run.get("workload")
    if path and Path(path).is_file():
        return Path(path)
    return None


def items_sha256(items: list[Any]) -> str:
    """A sha256 of a workload's requests: each one's repr, in arrival order."""
    digest = hashlib.sha256()
    for item in items:
        digest.update(repr(item).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def workload_entry(run: dict[str, Any], workload: Any) -> dict[str, Any]:
    path = workload_file(run, workload)
    return {
        "name": workload.name,
        "source": run.get("workload", "chat"),
        "path": str(path.resolve()) if path else None,
        "file_sha256": sha256_file(path) if path else None,
        "requests": len(workload.items),
        "items_sha256": items_sha256(workload.items),
    }


def seeds_of(config: Any, workload: Any) -> dict[str, Any]:
    """The seeds a run used: the engine's (sampling) and the workload's (None for a trace)."""
    spec = workload.params.get("spec") or {}
    return {"engine": config.seed, "workload": workload.params.get("seed", spec.get("seed"))}


def build_manifest(
    argv: list[str], config: Any, run: dict[str, Any], workload: Any, *,
    configs: list[Any] | None = None, seeds: dict[str, Any] | None = None, cwd: str | None = None,
    config_file: str | None = None,
) -> dict[str, Any]:
    """The manifest (see the module docstring) of the runs of `configs` (default: `config` alone)
    on `workload`, started by `argv` with run options `run` (and `config_file`, the `--config`
    file, whose hash it records, as that of a calibrated cost model's file)."""
    configs = configs or [config]
    extra: dict[str, Any] = {}
    params = run.get("cost_params") or {}
    for key, path in (("config_file", config_file), ("cost_model_file", params.get("path"))):
        if isinstance(path, str) and Path(path).is_file():
            extra[key] = {"path": str(Path(path).resolve()), "sha256": sha256_file(path)}
    return {
        "metroline": {"version": metroline_version(), "git": git_state()},
        "python": {"version": platform.python_version(), "implementation": platform.python_implementation()},
        "platform": platform.platform(),
        "packages": package_versions(),
        "command": {"argv": list(argv), "cwd": cwd or str(Path.cwd())},
        "config": config.model_dump(mode="json"),
        "run": run,
        "plugins": plugin_entries(configs),
        "workload": workload_entry(run, workload),
        **extra,
        "seeds": seeds or seeds_of(config, workload),
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
    }


def argv_of(args: Any) -> list[str]:
    """The command line a parsed `args` came from (`cli.main` keeps it as `args.argv`)."""
    return list(getattr(args, "argv", None) or sys.argv[1:])
