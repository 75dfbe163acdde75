"""`make run` and `make install` install the project editable (pip install -e .) without
setuptools' "Editable installation ... Please be careful with folders in your working
directory" warning block, which every first `make run` of a fresh clone printed.

setuptools prints it when it installs an import hook (its lenient strategy for a
layout it does not take for one sys.path entry); with the packages' parent folder
named (``package-dir = {"" = "."}``) and every package under it, it writes a plain
.pth entry instead, silently. Building the editable wheel needs setuptools >= 77 from
an index, so these check the configuration, and setuptools' own choice on it."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def setuptools_config() -> dict[str, Any]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    found: dict[str, Any] = config["tool"]["setuptools"]
    return found


def test_the_packages_parent_folder_is_named() -> None:
    config = setuptools_config()
    assert config.get("package-dir") == {"": "."}
    assert config["packages"]["find"]["include"] == ["app*"]
    assert (ROOT / "app" / "__init__.py").is_file()


def test_setuptools_chooses_a_plain_path_entry() -> None:
    setuptools = pytest.importorskip("setuptools")  # not in every venv from Python 3.12
    editable = pytest.importorskip("setuptools.command.editable_wheel")
    config = setuptools_config()
    package_dir: dict[str, str] = config.get("package-dir", {})
    packages = setuptools.find_packages(str(ROOT), include=config["packages"]["find"]["include"])
    assert "app.engine" in packages
    assert not any(p.split(".")[0] in {"tests", "bench", "examples"} for p in packages)
    # setuptools' condition for the static .pth (command/editable_wheel.py,
    # _select_strategy), which prints no warning block.
    assert set(package_dir) == {""}
    assert editable._simple_layout(packages, package_dir, str(ROOT))
