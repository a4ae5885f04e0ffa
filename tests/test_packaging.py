"""pyproject's hand-kept package list against the tree: every package directory is listed (under its
diagd.* name), nothing listed is gone, and every file that is not Python is package data. The wheel
itself is checked in tests/e2e/test_install.py."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

TOP = Path(__file__).resolve().parent.parent
SETUPTOOLS = tomllib.loads((TOP / "pyproject.toml").read_text())["tool"]["setuptools"]


def tree_packages() -> dict[str, Path]:
    """diagd.* package name -> its directory, for every directory holding an __init__.py."""
    found = {}
    for name, folder in SETUPTOOLS["package-dir"].items():
        for init in (TOP / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(TOP / folder)
            found[".".join([name, *rel.parts])] = init.parent
    return found


def test_every_package_directory_is_listed_and_nothing_else() -> None:
    assert sorted(SETUPTOOLS["packages"]) == sorted(tree_packages())


def extension_files() -> set[Path]:
    """What the C extensions are built from (their sources) and into (`<module>.<abi tag>.so` beside them)."""
    found = set()
    packages = tree_packages()
    for ext in SETUPTOOLS.get("ext-modules", []):
        found.update(TOP / source for source in ext["sources"])
        package, module = ext["name"].rsplit(".", 1)
        found.update(packages[package].glob(f"{module}.*.so"))
    return found


def test_every_extension_is_built_from_a_source_in_the_tree_into_a_listed_package() -> None:
    packages = tree_packages()
    for ext in SETUPTOOLS.get("ext-modules", []):
        assert ext["name"].rsplit(".", 1)[0] in packages, ext["name"]
        assert all((TOP / source).is_file() for source in ext["sources"]), ext


def test_every_file_that_is_not_python_is_package_data() -> None:
    data = SETUPTOOLS.get("package-data", {})
    built = extension_files()
    missing = []
    for name, folder in tree_packages().items():
        for path in folder.iterdir():
            if path.is_file() and path.suffix not in (".py", ".pyc") and path not in built and not any(
                    fnmatch.fnmatch(path.name, pattern) for pattern in data.get(name, ())):
                missing.append(str(path.relative_to(TOP)))
    assert not missing, f"not in [tool.setuptools.package-data]: {missing}"


def test_a_mac_installs_diagd_as_a_client_without_the_linux_only_drgn() -> None:
    # drgn has no macOS wheel: the laptop that reaches a lab with `diagd mcp --ssh` must still install diagd.
    from packaging.requirements import Requirement

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    requirements = [Requirement(r) for r in project["dependencies"]]
    on_a_mac = {"sys_platform": "darwin", "platform_system": "Darwin"}
    on_linux = {"sys_platform": "linux", "platform_system": "Linux"}
    drgn = [r for r in requirements if r.name == "drgn"]
    assert len(drgn) == 1 and drgn[0].marker is not None
    assert not drgn[0].marker.evaluate(on_a_mac) and drgn[0].marker.evaluate(on_linux)
