"""Mutation testing for metroline: does a module's own test file notice a one-point change?

mutmut and cosmic-ray expect a package folder under the repository root; here the root itself is
the package `metroline` (setup.py's `package_dir`), so this small tool does the same job. For each
module it makes single-point mutants from the module's syntax tree (a flipped comparison, an
off-by-one, a dropped guard, ...), applies each one to a private copy of the tree and runs the
module's own test files on it (`pytest -x`), then, if the mutant survived them, the wider files
that bench/mutation.toml maps to the module. A mutant a test run fails on is killed; one that runs
past the timeout counts as killed and is reported apart; one every file passes on survived.
Mutants that cannot change behaviour are listed in the configuration with the reason and are not
run. The report gives, per module, killed / timeout / survived / equivalent, the kill rate with
equivalents left out, and each survivor as a diff line with file:line.

    python bench/mutate.py --group core-step                 # every module of a group
    python bench/mutate.py --module core/step/admission.py   # one module
    python bench/mutate.py --group kv --sample 20 --seed 1   # 20 mutants a module, drawn by seed
    python bench/mutate.py --module kv_backends/block_pool.py --list   # the mutants, not run

A group entry may name the Python its tests run with (`python = "$METROLINE_VLLM_PYTHON"`, read
from the environment): the vLLM bridge's tests need a Python that has vLLM.

Operators (each mutant is one of them at one place, and still compiles):
  compare     < <=, > >=, == !=, is / is not, in / not in (each to its partner)
  int         an integer constant n to n + 1 and to n - 1
  plus-one    x + 1 to x - 1 and x - 1 to x + 1
  bool-op     and to or, or to and
  negate      the condition of an if / elif / while / conditional expression / comprehension filter
              to `not (...)` (not where `compare` already gives the negation: ==, is, in, ...)
  drop-guard  an `if` without else whose body is one return / raise / continue / break, removed
  min-max     min( to max( and max( to min(
  drop-not    `not x` to `x`
  true-false  True to False and False to True
  tie-break   two neighbouring items of a sort key's tuple (a `key=lambda ...: (...)` or a tuple
              pushed on a heap) swapped

A mutant is named, stably across edits elsewhere in the file, by its module, operator, the text of
the line(s) it changes and the text they become (bench/mutation.toml's `[[equivalent]]` entries use
that name; an `occurrence` tells identical lines apart).
"""

from __future__ import annotations

import argparse
import ast
import copy
import dataclasses
import os
import queue
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "bench" / "mutation.toml"


# ---------------------------------------------------------------------------------------------
# Mutants


@dataclasses.dataclass(frozen=True)
class Mutant:
    """One single-point change of a module's source."""

    module: str          # the path under the repository root, e.g. "core/step/admission.py"
    operator: str        # one of the operators above
    line: int            # the first changed line (1-based), for the report only
    before: str          # the changed lines as they are, stripped and joined by " "
    after: str           # the same lines mutated
    occurrence: int      # 0 for the first mutant with this (operator, before, after), 1 next, ...
    source: str          # the whole mutated module

    @property
    def key(self) -> tuple:
        return (self.module, self.operator, self.before, self.after, self.occurrence)

    def diff(self) -> str:
        return f"{self.module}:{self.line}: [{self.operator}] {self.before}  -->  {self.after}"


_COMPARE_PARTNER = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
    ast.In: ast.NotIn, ast.NotIn: ast.In,
}
_COMPARE_TEXT = {
    ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=",
    ast.Is: "is", ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in",
}
_COMPARE_RE = re.compile(r"\bis\s+not\b|\bnot\s+in\b|\bis\b|\bin\b|<=|>=|==|!=|<|>")
_NEGATED_BY_COMPARE = (ast.Eq, ast.NotEq, ast.Is, ast.IsNot, ast.In, ast.NotIn)
_GUARD_BODY = (ast.Return, ast.Raise, ast.Continue, ast.Break)


class _Source:
    """A module's text with byte offsets for the AST's (line, column) positions."""

    def __init__(self, text: str):
        self.text = text
        self.data = text.encode()
        self.starts = [0]
        for line in self.data.splitlines(keepends=True):
            self.starts.append(self.starts[-1] + len(line))

    def pos(self, lineno: int, col: int) -> int:
        return self.starts[lineno - 1] + col

    def span(self, node) -> tuple[int, int]:
        return self.pos(node.lineno, node.col_offset), self.pos(node.end_lineno, node.end_col_offset)

    def segment(self, node) -> str:
        start, end = self.span(node)
        return self.data[start:end].decode()

    def apply(self, edits) -> str:
        data = self.data
        for start, end, new in sorted(edits, reverse=True):
            data = data[:start] + new.encode() + data[end:]
        return data.decode()


def _parents(tree):
    """(parent, field, index) for every node; index is None for a single-node field."""
    out = {}
    for parent in ast.walk(tree):
        for field, value in ast.iter_fields(parent):
            if isinstance(value, list):
                for i, child in enumerate(value):
                    if isinstance(child, ast.AST):
                        out[id(child)] = (parent, field, i)
            elif isinstance(value, ast.AST):
                out[id(value)] = (parent, field, None)
    return out


def _skipped(tree) -> set[int]:
    """Nodes never mutated: annotations, docstrings, `if TYPE_CHECKING:` blocks, `__all__`."""
    skip = set()

    def drop(node):
        if node is not None:
            skip.update(id(n) for n in ast.walk(node))

    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            drop(node.returns)
            for arg in node.args.posonlyargs + node.args.args + node.args.kwonlyargs:
                drop(arg.annotation)
            for arg in (node.args.vararg, node.args.kwarg):
                if arg is not None:
                    drop(arg.annotation)
        elif isinstance(node, ast.AnnAssign):
            drop(node.annotation)
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            drop(node)
        elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            drop(node)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                drop(body[0])
    return skip


def _candidates(node, src: _Source):
    """(operator, new node, precise text edits or None) for every mutant of this one node.

    The new node is what the AST must become; the edits, when given, change the fewest characters
    (an operator token); without them, or if they do not give that AST, the node's text is
    replaced by the unparsed new node in parentheses."""
    if isinstance(node, ast.Compare):
        gaps = [node.left] + node.comparators
        for i, op in enumerate(node.ops):
            new = copy.deepcopy(node)
            new.ops[i] = _COMPARE_PARTNER[type(op)]()
            start, end = src.span(gaps[i])[1], src.span(gaps[i + 1])[0]
            gap = src.data[start:end].decode()
            m = _COMPARE_RE.search(gap)
            edits = None
            if m:
                text = gap[:m.start()] + _COMPARE_TEXT[type(new.ops[i])] + gap[m.end():]
                edits = [(start, end, text)]
            yield "compare", new, edits
    elif isinstance(node, ast.Constant) and type(node.value) is int:
        for delta in (1, -1):
            value = node.value + delta
            new = ast.Constant(value) if value >= 0 else ast.UnaryOp(ast.USub(), ast.Constant(-value))
            yield "int", new, [(*src.span(node), repr(value))]
    elif (isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub))
          and isinstance(node.right, ast.Constant) and node.right.value == 1
          and type(node.right.value) is int):
        new = copy.deepcopy(node)
        new.op = ast.Sub() if isinstance(node.op, ast.Add) else ast.Add()
        start, end = src.span(node.left)[1], src.span(node.right)[0]
        gap = src.data[start:end].decode()
        text = gap.replace("+", "-") if isinstance(node.op, ast.Add) else gap.replace("-", "+")
        yield "plus-one", new, [(start, end, text)]
    elif isinstance(node, ast.BoolOp):
        new = copy.deepcopy(node)
        new.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        word, other = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
        edits = []
        for a, b in zip(node.values, node.values[1:]):
            start, end = src.span(a)[1], src.span(b)[0]
            gap = src.data[start:end].decode()
            edits.append((start, end, re.sub(rf"\b{word}\b", other, gap, count=1)))
        yield "bool-op", new, edits
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        yield "drop-not", copy.deepcopy(node.operand), [(*src.span(node), src.segment(node.operand))]
    elif isinstance(node, ast.Constant) and type(node.value) is bool:
        yield "true-false", ast.Constant(not node.value), [(*src.span(node), str(not node.value))]
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
          and node.func.id in ("min", "max")):
        other = "max" if node.func.id == "min" else "min"
        new = copy.deepcopy(node)
        new.func.id = other
        yield "min-max", new, [(*src.span(node.func), other)]
    if isinstance(node, ast.Call):
        tuples = [kw.value.body for kw in node.keywords
                  if kw.arg == "key" and isinstance(kw.value, ast.Lambda)
                  and isinstance(kw.value.body, ast.Tuple)]
        if (isinstance(node.func, ast.Attribute) and node.func.attr == "heappush"
                and len(node.args) == 2 and isinstance(node.args[1], ast.Tuple)):
            tuples.append(node.args[1])
        for tup in tuples:
            for i in range(len(tup.elts) - 1):
                new_tup = copy.deepcopy(tup)
                new_tup.elts[i], new_tup.elts[i + 1] = new_tup.elts[i + 1], new_tup.elts[i]
                a, b = tup.elts[i], tup.elts[i + 1]
                edits = [(*src.span(a), src.segment(b)), (*src.span(b), src.segment(a))]
                yield "tie-break", ("replace", tup, new_tup), edits


def _conditions(node):
    """The condition expressions the `negate` operator wraps in `not (...)`."""
    if isinstance(node, (ast.If, ast.While, ast.IfExp)):
        yield node.test
    elif isinstance(node, ast.comprehension):
        yield from node.ifs


def _dump(tree) -> str:
    return ast.dump(tree, include_attributes=False)


def generate(module: str, text: str) -> list[Mutant]:
    """Every mutant of one module's source, in source order (deterministic)."""
    tree = ast.parse(text)
    src = _Source(text)
    parents = _parents(tree)
    skip = _skipped(tree)
    lines = text.splitlines()
    raw = []  # (target node, new node, edits, operator)

    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        for op, new, edits in _candidates(node, src):
            if isinstance(new, tuple):          # ("replace", inner node, its new version)
                _, target, new = new
            else:
                target = node
            raw.append((target, new, edits, op))
        for cond in _conditions(node):
            if isinstance(cond, ast.UnaryOp) and isinstance(cond.op, ast.Not):
                continue                          # `drop-not` covers it
            if (isinstance(cond, ast.Compare) and len(cond.ops) == 1
                    and type(cond.ops[0]) in _NEGATED_BY_COMPARE):
                continue                          # `compare` gives this negation already
            new = ast.UnaryOp(ast.Not(), copy.deepcopy(cond))
            text = src.segment(cond)
            if not isinstance(cond, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)):
                text = f"({text})"
            raw.append((cond, new, [(*src.span(cond), f"not {text}")], "negate"))
        if (isinstance(node, ast.If) and not node.orelse and len(node.body) == 1
                and isinstance(node.body[0], _GUARD_BODY)):
            raw.append((node, ast.Pass(), [(*src.span(node), "pass")], "drop-guard"))

    mutants, seen = [], {}
    for target, new, edits, op in raw:
        parent, field, index = parents[id(target)]
        holder = getattr(parent, field)
        if index is None:
            setattr(parent, field, new)
        else:
            holder[index] = new
        try:
            expected = _dump(tree)
        finally:
            if index is None:
                setattr(parent, field, target)
            else:
                holder[index] = target
        attempts = []
        if edits:
            attempts.append(edits)
        segment_new = ast.unparse(new)
        if not isinstance(new, ast.stmt):
            segment_new = f"({segment_new})"
        attempts.append([(*src.span(target), segment_new)])
        for attempt in attempts:
            mutated = src.apply(attempt)
            try:
                if _dump(ast.parse(mutated)) == expected:
                    break
            except SyntaxError:
                pass
        else:
            continue  # no faithful text for this mutant: not generated
        first = min(src.data.count(b"\n", 0, start) for start, _, _ in attempt) + 1
        last_end = max(end for _, end, _ in attempt)
        last = src.data.count(b"\n", 0, max(last_end - 1, 0)) + 1
        before = " ".join(l.strip() for l in lines[first - 1:last])
        new_lines = mutated.splitlines()
        shift = len(new_lines) - len(lines)
        after = " ".join(l.strip() for l in new_lines[first - 1:last + shift])
        name = (op, before, after)
        occurrence = seen.get(name, 0)
        seen[name] = occurrence + 1
        mutants.append(Mutant(module, op, first, before, after, occurrence, mutated))
    mutants.sort(key=lambda m: (m.line, m.operator, m.after, m.occurrence))
    return mutants


# ---------------------------------------------------------------------------------------------
# Configuration


@dataclasses.dataclass
class Config:
    groups: dict[str, list[str]]             # group name -> module paths
    tests: dict[str, list[str]]              # module -> its own test files
    wider: dict[str, list[str]]              # module -> further test files
    python: dict[str, str]                   # module -> the interpreter its tests run with
    equivalent: dict[tuple, str]             # Mutant.key -> reason
    timeout_factor: float
    timeout_floor: float


def load_config(path: Path = CONFIG) -> Config:
    data = tomllib.loads(path.read_text())
    groups, tests, wider, python = {}, {}, {}, {}
    for name, group in data.get("group", {}).items():
        modules = []
        for entry in group["modules"]:
            for module in entry.get("paths", []):
                modules.append(module)
                tests[module] = list(entry["tests"])
                wider[module] = list(entry.get("wider", []))
                python[module] = entry.get("python", "")
        groups[name] = modules
    equivalent = {}
    for entry in data.get("equivalent", []):
        key = (entry["module"], entry["operator"], entry["line"], entry["mutant"],
               entry.get("occurrence", 0))
        equivalent[key] = entry["reason"]
    run = data.get("run", {})
    return Config(groups, tests, wider, python, equivalent,
                  float(run.get("timeout_factor", 4.0)), float(run.get("timeout_floor", 30.0)))


def interpreter(spec: str) -> str:
    """The Python a module's tests run with: the entry's `python` (`$NAME` read from the
    environment; a bare name looked up on PATH), or, without one, the Python running this tool.
    Raises ValueError naming what is missing."""
    if not spec:
        return sys.executable
    path = os.path.expandvars(spec)
    if "$" in path:
        name = re.search(r"\$\{?(\w+)", path).group(1)
        raise ValueError(f"python = {spec!r}: ${name} is not set (the path of a Python "
                         "that has what these tests import)")
    found = shutil.which(path)
    if found is None:
        raise ValueError(f"python = {spec!r}: {path} is not an executable")
    return found


# ---------------------------------------------------------------------------------------------
# Running


_IGNORE = shutil.ignore_patterns(".git", "__pycache__", "*.pyc", ".venv", "build", "*.egg-info",
                                 ".pytest_cache", ".hypothesis")


class Workspace:
    """A private copy of the tree, importable as `metroline` (a symlink on PYTHONPATH)."""

    def __init__(self, root: Path = ROOT):
        self.root = root
        self.dir = Path(tempfile.mkdtemp(prefix="metroline-mutate-"))
        self.tree = self.dir / "tree"
        shutil.copytree(root, self.tree, ignore=_IGNORE, symlinks=True)
        (self.dir / "path").mkdir()
        (self.dir / "path" / "metroline").symlink_to(self.tree)

    def apply(self, module: str, source: str):
        (self.tree / module).write_text(source)

    def restore(self, module: str):
        shutil.copyfile(self.root / module, self.tree / module)

    def pytest(self, files: list[str], timeout: float, log: Path | None = None,
               python: str | None = None) -> tuple[str, float]:
        """'passed', 'failed' or 'timeout' for `pytest -x` on these files, and the seconds
        (`log`: a file for pytest's output, which is dropped otherwise; `python`: the interpreter,
        this one by default)."""
        env = dict(os.environ, PYTHONPATH=str(self.dir / "path"), PYTHONDONTWRITEBYTECODE="1",
                   OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        cmd = [python or sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *files]
        started = time.monotonic()
        out = open(log, "w") if log is not None else subprocess.DEVNULL
        try:
            self.proc = proc = subprocess.Popen(cmd, cwd=self.tree, env=env, stdout=out,
                                                stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            if log is not None:
                out.close()
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            return "timeout", time.monotonic() - started
        return ("passed" if code == 0 else "failed"), time.monotonic() - started

    def stop(self):
        """Kill the test run in progress, if any."""
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, 9)

    def close(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def run_mutant(ws: Workspace, mutant: Mutant, own: list[str], wider: list[str],
               timeouts: dict[tuple, float], python: str = sys.executable) -> tuple[str, str]:
    """('killed' | 'timeout' | 'survived', which files decided it). `timeouts` is keyed by
    (python, *files)."""
    ws.apply(mutant.module, mutant.source)
    try:
        for label, files in (("own", own), ("wider", wider)):
            if not files:
                continue
            outcome, _ = ws.pytest(files, timeouts[(python, *files)], python=python)
            if outcome == "failed":
                return "killed", label
            if outcome == "timeout":
                return "timeout", label
        return "survived", ""
    finally:
        ws.restore(mutant.module)


def select(config: Config, module: str, sample: int | None, seed: int, only: str | None = None):
    """(mutants to run, equivalent mutants with reasons, how many it has) for one module."""
    mutants = generate(module, (ROOT / module).read_text())
    if only:
        mutants = [m for m in mutants if re.search(only, m.diff())]
    equivalent = [(m, config.equivalent[m.key]) for m in mutants if m.key in config.equivalent]
    live = [m for m in mutants if m.key not in config.equivalent]
    if sample is not None and sample < len(live):
        picked = set(id(m) for m in random.Random(f"{seed}:{module}").sample(live, sample))
        live = [m for m in live if id(m) in picked]
    return live, equivalent, len(mutants)


def _interrupt(signum, frame):
    raise KeyboardInterrupt  # SIGTERM (and SIGINT, which a background job ignores) stop a run


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--group", help="a group of bench/mutation.toml (e.g. core-step), or all of them: all")
    what.add_argument("--module", action="append",
                      help="a module path, e.g. core/step/admission.py (repeatable)")
    parser.add_argument("--sample", type=int, help="at most N mutants a module, drawn by --seed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-j", "--jobs", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--only", metavar="REGEX",
                        help="only the mutants whose report line (file:line: [operator] ...) matches")
    parser.add_argument("--list", action="store_true", help="print the mutants; run nothing")
    parser.add_argument("--own-only", action="store_true", help="skip the wider test files")
    parser.add_argument("--config", type=Path, default=CONFIG)
    args = parser.parse_args(argv)

    config = load_config(args.config)
    if args.group == "all":
        modules = [m for group in config.groups.values() for m in group]
    elif args.group:
        if args.group not in config.groups:
            parser.error(f"--group {args.group!r}: not in {args.config.name} "
                         f"(groups: {', '.join(sorted(config.groups))})")
        modules = config.groups[args.group]
    else:
        modules = args.module
        for module in modules:
            if module not in config.tests:
                parser.error(f"--module {module!r}: no test files mapped to it in "
                             f"{args.config.name}")

    plan = {m: select(config, m, args.sample, args.seed, args.only) for m in modules}
    if not args.only:  # an entry whose line changed names no mutant any more: say so
        named = {m.key for _, equivalent, _ in plan.values() for m, _ in equivalent}
        for key in config.equivalent:
            if key[0] in plan and key not in named:
                print(f"bench/mutation.toml: no mutant matches the equivalent entry {key}",
                      file=sys.stderr)
    if args.list:
        for module, (live, equivalent, total) in plan.items():
            print(f"# {module}: {total} mutants, {len(equivalent)} equivalent, "
                  f"{len(live)} selected")
            for m in live:
                print(m.diff())
            for m, reason in equivalent:
                print(f"{m.diff()}   (equivalent: {reason})")
        return 0

    pythons = {}
    for module in modules:
        try:
            pythons[module] = interpreter(config.python[module])
        except ValueError as exc:
            parser.error(f"{module}: {exc}")

    signal.signal(signal.SIGTERM, _interrupt)
    workspaces = queue.Queue()
    made = [Workspace() for _ in range(max(1, args.jobs))]
    for ws in made:
        workspaces.put(ws)
    try:
        # the unmutated tree must pass each test list; its time sets that list's timeout
        timeouts = {}
        ws = made[0]
        for module in modules:
            python = pythons[module]
            for files in (config.tests[module], [] if args.own_only else config.wider[module]):
                key = (python, *files)
                if files and key not in timeouts:
                    log = ws.dir / "baseline.log"
                    outcome, seconds = ws.pytest(files, timeout=3600, log=log, python=python)
                    if outcome != "passed":
                        tail = "\n".join(log.read_text().splitlines()[-30:])
                        print(f"{tail}\nthe unmutated tree fails {' '.join(files)}: fix that "
                              "first", file=sys.stderr)
                        return 2
                    timeouts[key] = max(config.timeout_floor, seconds * config.timeout_factor)
                    shown = "" if python == sys.executable else f" (with {python})"
                    print(f"baseline {' '.join(files)}{shown}: {seconds:.1f} s "
                          f"(timeout {timeouts[key]:.0f} s)", flush=True)

        lock = threading.Lock()
        results = {}

        stopping = threading.Event()

        def work(module, mutant):
            if stopping.is_set():
                return
            ws = workspaces.get()
            try:
                wider = [] if args.own_only else config.wider[module]
                outcome, by = run_mutant(ws, mutant, config.tests[module], wider, timeouts,
                                         pythons[module])
            finally:
                workspaces.put(ws)
            if stopping.is_set():
                return  # its test run was killed by Ctrl-C: no outcome
            with lock:
                results.setdefault(module, []).append((mutant, outcome, by))
                if outcome == "survived":  # named at once, so a long run can be acted on early
                    print(f"\nS {mutant.diff()}", flush=True)
                else:
                    print("." if outcome == "killed" else "T", end="", flush=True)

        started = time.monotonic()
        pool = ThreadPoolExecutor(max_workers=max(1, args.jobs))
        try:
            futures = [pool.submit(work, module, m)
                       for module, (live, _, _) in plan.items() for m in live]
            for f in futures:
                f.result()
        except KeyboardInterrupt:  # Ctrl-C: no new mutant, the running ones' tests are killed
            stopping.set()
            pool.shutdown(wait=False, cancel_futures=True)
            for ws in made:
                ws.stop()
            print("\ninterrupted: the report covers the mutants that ran")
        else:
            pool.shutdown()
        print()
        return report(plan, results, time.monotonic() - started, args)
    finally:
        for ws in made:
            ws.close()


def report(plan, results, seconds, args) -> int:
    totals = dict(killed=0, timeout=0, survived=0, equivalent=0)
    survivors = []
    print(f"\n{'module':<40} {'mutants':>7} {'run':>4} {'killed':>6} {'(wider)':>7} "
          f"{'timeout':>7} {'survived':>8} {'equiv':>5} {'kill rate':>9}")
    for module, (live, equivalent, total) in plan.items():
        rows = results.get(module, [])
        killed = sum(1 for _, o, _ in rows if o == "killed")
        wider = sum(1 for _, o, by in rows if o == "killed" and by == "wider")
        timeout = sum(1 for _, o, _ in rows if o == "timeout")
        survived = [m for m, o, _ in rows if o == "survived"]
        ran = killed + timeout + len(survived)
        rate = f"{100 * (killed + timeout) / ran:.0f}%" if ran else "-"
        print(f"{module:<40} {total:>7} {ran:>4} {killed:>6} {wider:>7} {timeout:>7} "
              f"{len(survived):>8} {len(equivalent):>5} {rate:>9}")
        totals["killed"] += killed
        totals["timeout"] += timeout
        totals["survived"] += len(survived)
        totals["equivalent"] += len(equivalent)
        survivors.extend(sorted(survived, key=lambda m: m.line))
    ran = totals["killed"] + totals["timeout"] + totals["survived"]
    rate = f"{100 * (totals['killed'] + totals['timeout']) / ran:.1f}%" if ran else "-"
    print(f"{'total':<40} {'':>7} {ran:>4} {totals['killed']:>6} {'':>7} {totals['timeout']:>7} "
          f"{totals['survived']:>8} {totals['equivalent']:>5} {rate:>9}")
    sampled = f", --sample {args.sample} --seed {args.seed}" if args.sample else ""
    print(f"({seconds:.0f} s, -j {args.jobs}{sampled})")
    if survivors:
        print("\nsurvivors:")
        for m in survivors:
            print("  " + m.diff())
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
