"""The extras pin versions that work together: s3fs of the fsspec generation in use."""

from __future__ import annotations

import configparser
import os
import pathlib
import re
from importlib import metadata

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = pathlib.Path(os.path.dirname(__file__)).resolve().parents[1]


def _extras() -> dict[str, list[Requirement]]:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    out = {}
    for name, value in config["options.extras_require"].items():
        out[name] = [Requirement(line) for line in value.splitlines() if line.strip() and not line.startswith("#")]
    return out


def _install_requires() -> dict[str, Requirement]:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    lines = config["options"]["install_requires"].splitlines()
    return {r.name: r for r in (Requirement(line) for line in lines if line.strip())}


def paired(s3fs_version: str, fsspec_version: str) -> bool:
    """s3fs (calendar versions since 2021.04, each release pinning the fsspec of its version) is not
    older than the fsspec it runs with."""
    return Version(s3fs_version) >= Version(fsspec_version)


def test_pairing_rule():
    assert paired("2026.9.0", "2026.9.0")
    assert not paired("0.4.2", "2026.9.0")  # what an unpinned extra once resolved
    assert not paired("2023.6.0", "2024.2.0")


def test_s3_extras_pin_an_s3fs_of_the_fsspec_generation():
    fsspec_floor = Version(re.sub(r"^>=", "", str(_install_requires()["fsspec"].specifier)))
    for extra in ("s3", "test"):
        s3fs = [r for r in _extras()[extra] if r.name == "s3fs"]
        assert s3fs, f"the {extra} extra does not name s3fs"
        floors = [Version(spec.version) for spec in s3fs[0].specifier if spec.operator == ">="]
        assert floors and floors[0] >= fsspec_floor, (
            f"{extra}: {s3fs[0]} admits an s3fs older than fsspec {fsspec_floor}"
        )
        assert not s3fs[0].specifier.contains("0.4.2")


def test_installed_s3fs_is_not_older_than_fsspec():
    try:
        s3fs_version = metadata.version("s3fs")
    except metadata.PackageNotFoundError:
        pytest.skip("s3fs is not installed")
    fsspec_version = metadata.version("fsspec")
    assert paired(s3fs_version, fsspec_version), (
        f"s3fs {s3fs_version} is older than fsspec {fsspec_version}; install the s3fs of that fsspec: "
        f"pip install 's3fs=={fsspec_version}'"
    )
