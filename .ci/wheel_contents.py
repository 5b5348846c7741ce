"""Check a built wheel against the repository: every tracked file of the package (its modules and
their data files; tests, bench scripts, docs and examples aside) is in the wheel, under
`metroline/`, and the wheel holds no module the repository does not track.

    python .ci/wheel_contents.py dist/metroline-*.whl
"""

import subprocess
import sys
import zipfile
from pathlib import Path

NOT_SHIPPED = ("tests/", "bench/", "docs/", "examples/", ".ci/")
ROOT_FILES_NOT_SHIPPED = {"setup.py"}


def main(wheel: str) -> int:
    root = Path(__file__).resolve().parent.parent
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=root, check=True, capture_output=True, text=True
    ).stdout.split()
    packaged_dirs = {p.rsplit("/", 1)[0] if "/" in p else "" for p in tracked if p.endswith("__init__.py")}
    expected = set()
    for path in tracked:
        folder = path.rsplit("/", 1)[0] if "/" in path else ""
        if path.startswith(NOT_SHIPPED) or path in ROOT_FILES_NOT_SHIPPED or folder not in packaged_dirs:
            continue
        if folder == "" and not path.endswith(".py"):
            continue  # README, CHANGELOG, pyproject: the wheel's metadata, not package files
        expected.add(f"metroline/{path}")
    with zipfile.ZipFile(wheel) as zf:
        names = {n for n in zf.namelist() if n.startswith("metroline/")}
    missing = sorted(expected - names)
    extra = sorted(n for n in names - expected if n.endswith(".py"))
    for name in missing:
        print(f"missing from the wheel: {name}")
    for name in extra:
        print(f"in the wheel but not tracked: {name}")
    print(f"{wheel}: {len(expected)} tracked package files, {len(names)} in the wheel, "
          f"{len(missing)} missing, {len(extra)} untracked modules")
    return 1 if missing or extra else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
