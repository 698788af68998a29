"""constraints.txt (scripts/constraints.sh): the versions `make venv`, the container image and CI install. Every
package pyproject.toml requires (the core, and the torch, dev and ocr extras `make venv` installs) is pinned there,
each pin satisfies pyproject's own floor, the environment this runs in holds exactly those versions, and the
Makefile and the Dockerfile install through it."""
from __future__ import annotations

import importlib.metadata as md
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


def _pins() -> dict[str, Version]:
    out = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, v = line.partition("==")
            out[canonicalize_name(name)] = Version(v.strip())
    return out


def _required() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    reqs = [Requirement(r) for r in project["dependencies"] + extras["torch"] + extras["dev"] + extras["ocr"]]
    return [r for r in reqs if canonicalize_name(r.name) != "crossprobe"]


def test_every_requirement_is_pinned_within_its_floor():
    pins = _pins()
    missing = [r.name for r in _required() if canonicalize_name(r.name) not in pins]
    assert not missing, f"not in constraints.txt: {missing} (scripts/constraints.sh)"
    outside = [f"{r} vs {pins[canonicalize_name(r.name)]}" for r in _required()
               if not r.specifier.contains(pins[canonicalize_name(r.name)], prereleases=True)]
    assert not outside, outside


def test_this_environment_holds_the_pinned_versions():
    pins = _pins()
    differ = []
    for name, want in pins.items():
        try:
            got = Version(md.version(name))
        except md.PackageNotFoundError:
            continue  # the GPU machines' variants, or a package only some platforms install
        if got != want:
            differ.append(f"{name}: {got} installed, {want} pinned")
    assert not differ, "the venv differs from constraints.txt (make venv, or scripts/constraints.sh): " + "; ".join(differ)


def test_make_venv_and_the_image_install_through_it():
    make = (ROOT / "Makefile").read_text()
    assert re.search(r"pip install -q -c constraints\.txt -e '\.\[torch,dev,ocr\]'", make)
    assert re.search(r"^\$\(STAMP\): pyproject\.toml constraints\.txt$", make, re.M)
    docker = (ROOT / "Dockerfile").read_text()
    assert "COPY pyproject.toml constraints.txt ./" in docker and "pip install -c constraints.txt -r" in docker
