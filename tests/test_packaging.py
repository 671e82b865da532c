"""What `pip install` ships: the wheel's packages, computed from pyproject.toml as setuptools
computes them (no wheel is built), are the kit and its engines, never the project's lab (the
findings with their reproductions, the calibration, the fakes, the known-failures files: all
under tests/, issue 39); and every package of the kit is on the map in its docstring."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import setuptools

import properties
from properties import engines

ROOT = Path(__file__).resolve().parents[1]
LAB = ("findings", "calibration", "fakes", "known")


def shipped() -> list[str]:
    """The packages the wheel ships: pyproject.toml's [tool.setuptools.packages.find], which
    finds namespace packages (folders without an __init__.py) unless it says otherwise."""
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"]["find"]
    finder = (setuptools.find_namespace_packages if find.get("namespaces", True)
              else setuptools.find_packages)
    packages = []
    for where in find.get("where", ["."]):
        packages += finder(str(ROOT / where), include=find.get("include", ("*",)),
                           exclude=find.get("exclude", ()))
    return sorted(p for p in packages if "__pycache__" not in p.split("."))


def test_the_wheel_ships_the_kit_and_not_the_lab():
    packages = shipped()
    assert {"properties", "properties.engines", "properties.serve", "reference",
            "fast"} <= set(packages), packages
    assert not [p for p in packages if p.split(".")[0] == "tests"], packages
    lab = [p for p in packages if set(p.split(".")) & set(LAB)]
    assert not lab, f"the lab is in the wheel: {lab}"


def test_the_lab_lives_under_tests():
    for part in LAB:
        assert (ROOT / "tests" / part).is_dir(), part
        assert not (ROOT / "properties" / part).is_dir(), part
    assert (ROOT / "tests" / "fakes" / "__init__.py").is_file()


def test_every_package_of_the_kit_is_on_its_map():
    """properties/__init__.py's map names each of its packages ("    NAME/   what it is"),
    and none of the lab's."""
    named = set(re.findall(r"^ {4}(\w+)/ ", properties.__doc__, re.M))
    packages = {p.split(".")[1] for p in shipped() if p.startswith("properties.")}
    assert packages, "no package found under properties/"
    missing = sorted(packages - named)
    assert not missing, f"not on the map in properties/__init__.py: {missing}"
    assert not named & set(LAB), f"the map names a part of the lab: {sorted(named & set(LAB))}"


def test_the_fake_engine_is_named_by_its_module_outside_the_package():
    """The engine table names the fake engine (tests/fakes/engine.py) by its full module path;
    an engine whose module is not installed is a KeyError that says so, left out of
    `available()`, where an engine's own missing import stays its own error."""
    assert engines.ENGINES["fake"] == "tests.fakes.engine"
    assert engines.get("fake").name == "fake" and "fake" in engines.available()
    engines.register("elsewhere", "tests.nowhere.engine")
    try:
        with pytest.raises(KeyError, match="'elsewhere' is not in this installation: its module "
                                           "tests.nowhere.engine cannot be imported"):
            engines.get("elsewhere")
        assert "elsewhere" not in engines.available()
    finally:
        engines.ENGINES.pop("elsewhere")
