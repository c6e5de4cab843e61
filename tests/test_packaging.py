"""What a non-editable install gets: a wheel built from the source carries the shipped profiles,
finds them from wherever it is installed, and builds without setuptools' deprecation warnings."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> tuple[Path, str]:
    """A wheel built from a copy of the source (the checkout gets no build/ folder), and the
    build's output."""
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src)
    shutil.copytree(REPO / "autoplace", src / "autoplace",
                    ignore=shutil.ignore_patterns("__pycache__"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps",
                        "--no-build-isolation", "-w", str(out), str(src)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    [whl] = out.glob("autoplace-*.whl")
    return whl, r.stdout + r.stderr


@pytest.mark.slow
def test_the_wheel_carries_the_shipped_profiles(wheel):
    from autoplace.profile import shipped_dir

    whl, _ = wheel
    names = set(zipfile.ZipFile(whl).namelist())
    shipped = {f"autoplace/profile/shipped/{p.name}" for p in shipped_dir().iterdir()
               if p.suffix in (".json", ".md")}
    assert shipped and shipped <= names, shipped - names


@pytest.mark.slow
def test_an_installed_wheel_finds_its_profiles_from_anywhere(wheel, tmp_path):
    whl, _ = wheel
    site = tmp_path / "site"
    zipfile.ZipFile(whl).extractall(site)  # what pip install puts in site-packages
    code = ("import autoplace.profile as p; print(p.__file__); "
            "print(p.DeviceProfile.load(p.shipped_dir() / 'amd-epyc-cpu-1thread.json').kind)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                       env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert r.returncode == 0, r.stderr
    where, kind = r.stdout.split()
    assert Path(where).is_relative_to(site) and kind == "cpu"


@pytest.mark.slow
def test_the_wheel_builds_without_deprecation_warnings_and_has_an_spdx_licence(wheel):
    whl, log = wheel
    metadata = zipfile.ZipFile(whl).read("autoplace-0.1.0.dist-info/METADATA").decode()
    assert "License-Expression: Apache-2.0" in metadata
    assert [l for l in log.splitlines() if "deprecat" in l.lower()] == []
