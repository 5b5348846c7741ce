"""The package list, found rather than written: the repository root is the package `metroline`.

setuptools' own discovery (`[tool.setuptools.packages.find]`) names a package by its folder, so
from this root it finds `core`, not `metroline.core`; here every folder with an `__init__.py` under
the root (tests and bench scripts aside) becomes `metroline.<folder>`, and each subpackage's data
files (e.g. `core/presets.toml`) go with it. A new subpackage or data file is in the wheel without
editing anything; `.ci/run` checks the built wheel against the tracked files. Everything else about
the project is in pyproject.toml.
"""

from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
NOT_SHIPPED = ["tests", "tests.*", "bench", "bench.*", "build", "build.*", "docs", "docs.*"]

subpackages = find_packages(where=str(ROOT), exclude=NOT_SHIPPED)
packages = ["metroline"] + [f"metroline.{name}" for name in subpackages]
package_data = {}
for name in subpackages:
    folder = ROOT.joinpath(*name.split("."))
    data = sorted(
        p.name for p in folder.iterdir()
        if p.is_file() and p.suffix not in {".py", ".pyc"} and not p.name.startswith(".")
    )
    if data:
        package_data[f"metroline.{name}"] = data



class BuildPy(build_py):
    """The root package's modules, less this file (which builds it, and is no module of it)."""

    def find_package_modules(self, package, package_dir):
        modules = super().find_package_modules(package, package_dir)
        return [m for m in modules if not (package == "metroline" and m[1] == "setup")]


setup(
    packages=packages,
    package_dir={"metroline": "."},
    package_data=package_data,
    cmdclass={"build_py": BuildPy},
)
