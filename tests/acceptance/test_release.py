"""A release as docs/release.md makes it: built from a clean clone, each commit its own version.

One clone of the repository gets two commits of its own: the first adds a module, the second
deletes it. The first is built in the clone's folder as ``pip install .`` builds it (which used
to leave the module in ``build/lib``); the second with ``python -m build`` (an sdist, then the
wheel from it) and with ``python -m build --wheel`` (straight from the folder). The wheels carry
the versions setuptools-scm gives their commits, the deleted module is in neither of the later
wheels, the wheel holds the license and the scrubber's rules, and ``twine check`` passes.

The builds run without isolation when this environment has the build backend's requirements
(the ``test`` extra installs them), with pip's isolated environments otherwise.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.version import Version

from tests.support import ROOT

# The real-system stage (wheels built from a clone, as test_install.py builds its own).
pytestmark = [pytest.mark.timeout(600), pytest.mark.realsystem]

PROBE = "recalltrace/_release_probe.py"


def _env() -> dict[str, str]:
    """This environment less what would steer a build or a version from outside."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("RECALLTRACE_", "PYTHON", "SETUPTOOLS_SCM", "GIT_"))
        and key != "DIST_EXTRA_CONFIG"
    }
    env.update(
        GIT_AUTHOR_NAME="Release Test",
        GIT_AUTHOR_EMAIL="release-test@example.invalid",
        GIT_COMMITTER_NAME="Release Test",
        GIT_COMMITTER_EMAIL="release-test@example.invalid",
    )
    return env


def _run(cmd: list[str], *, cwd: Path, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        cmd, cwd=cwd, env=env or _env(), capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, f"{cmd}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    return result.stdout + result.stderr


def _isolation_flags() -> tuple[list[str], list[str]]:
    """``python -m build`` and ``pip wheel`` flags: no isolation when the backend's
    requirements (setuptools 77+, setuptools-scm 10+) are installed here."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        ready = Version(version("setuptools")) >= Version("77") and Version(
            version("setuptools-scm")
        ) >= Version("10")
    except PackageNotFoundError:
        ready = False
    if ready and importlib.util.find_spec("setuptools_scm") is not None:
        return ["--no-isolation"], ["--no-build-isolation"]
    return [], []


def _wheel(folder: Path) -> Path:
    (wheel,) = folder.glob("recalltrace-*-py3-none-any.whl")
    return wheel


def _names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


def _metadata_version(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        for line in archive.read(metadata).decode("utf-8").splitlines():
            if line.startswith("Version: "):
                return line.removeprefix("Version: ")
    raise AssertionError(f"{wheel.name} has no Version in its METADATA")


@dataclass
class Builds:
    clone: Path
    added: str  # the commit that adds PROBE
    deleted: str  # the commit that deletes it
    installed_wheel: Path  # built at `added` in the clone's folder, as `pip install .` builds
    release: Path  # `python -m build` at `deleted`: the sdist and the wheel from it
    straight_wheel: Path  # `python -m build --wheel` at `deleted`, from the clone's folder
    output: str  # what the two `python -m build` runs printed


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> Builds:
    base = tmp_path_factory.mktemp("release")
    clone = base / "clone"
    _run(["git", "clone", "-q", str(ROOT), str(clone)], cwd=base)
    build_flags, pip_flags = _isolation_flags()
    git = ["git", "-C", str(clone)]

    (clone / PROBE).write_text('"""A module that a later commit deletes."""\n', encoding="utf-8")
    _run([*git, "add", PROBE], cwd=base)
    _run([*git, "commit", "-q", "-m", "Add a module"], cwd=base)
    added = _run([*git, "rev-parse", "HEAD"], cwd=base).strip()
    installed = base / "installed"
    _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *pip_flags,
         "-w", str(installed), "."],
        cwd=clone,
    )  # fmt: skip

    _run([*git, "rm", "-q", PROBE], cwd=base)
    _run([*git, "commit", "-q", "-m", "Delete the module"], cwd=base)
    deleted = _run([*git, "rev-parse", "HEAD"], cwd=base).strip()
    release = base / "release"
    straight = base / "straight"
    python_build = [sys.executable, "-m", "build", *build_flags]
    output = _run([*python_build, "--outdir", str(release), "."], cwd=clone)
    output += _run([*python_build, "--wheel", "--outdir", str(straight), "."], cwd=clone)
    return Builds(clone, added, deleted, _wheel(installed), release, _wheel(straight), output)


def test_two_commits_build_two_versions_that_name_their_commits(builds: Builds) -> None:
    before = _metadata_version(builds.installed_wheel)
    after = _metadata_version(_wheel(builds.release))
    assert builds.installed_wheel.name == f"recalltrace-{before}-py3-none-any.whl"
    assert _wheel(builds.release).name == f"recalltrace-{after}-py3-none-any.whl"
    assert _metadata_version(builds.straight_wheel) == after
    assert Version(after) > Version(before), (before, after)
    # Untagged commits: a dev release whose local part is the commit (g<hash>).
    for version, commit in ((before, builds.added), (after, builds.deleted)):
        parsed = Version(version)
        assert parsed.is_devrelease, version
        assert parsed.local is not None and parsed.local.startswith(f"g{commit[:7]}"), version
    (sdist,) = builds.release.glob("recalltrace-*.tar.gz")
    assert sdist.name == f"recalltrace-{after}.tar.gz"


def test_a_deleted_module_is_not_shipped(builds: Builds) -> None:
    probe = "recalltrace/_release_probe.py"
    assert probe in _names(builds.installed_wheel)
    assert probe not in _names(_wheel(builds.release))
    assert probe not in _names(builds.straight_wheel)
    # The builds leave no build/lib behind for a later one to ship from.
    assert not (builds.clone / "build").exists()


def test_the_wheel_holds_the_license_and_the_rules(builds: Builds) -> None:
    names = _names(_wheel(builds.release))
    (dist_info,) = {n.split("/", 1)[0] for n in names if ".dist-info/" in n}
    assert f"{dist_info}/licenses/LICENSE" in names
    with zipfile.ZipFile(_wheel(builds.release)) as archive:
        license_text = archive.read(f"{dist_info}/licenses/LICENSE").decode("utf-8")
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert license_text == (ROOT / "LICENSE").read_text(encoding="utf-8")
    rules = sorted(p.name for p in (ROOT / "tracer" / "_scrub" / "rules").iterdir())
    assert {"gitleaks.toml", "recalltrace.toml", "LICENSE-gitleaks"} <= set(rules)
    for name in rules:
        assert f"recalltrace/tracer/_scrub/rules/{name}" in names, name


def test_the_build_does_not_warn_about_the_rules_folder(builds: Builds) -> None:
    """The rules are package data of ``recalltrace.tracer._scrub``; setuptools warned that their
    folder looked like a package left out of the configuration."""
    assert "Successfully built" in builds.output
    assert "absent from the `packages` configuration" not in builds.output


def test_the_built_wheel_says_its_version(builds: Builds, tmp_path: Path) -> None:
    """``recalltrace --version`` from the wheel (unpacked without its dependencies, which
    this environment has) prints the version its file name carries."""
    target = tmp_path / "site"
    _run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
         "--target", str(target), str(_wheel(builds.release))],
        cwd=tmp_path,
    )  # fmt: skip
    env = _env() | {"PYTHONPATH": str(target)}
    printed = _run([sys.executable, "-m", "recalltrace", "--version"], cwd=tmp_path, env=env)
    assert printed.strip() == f"recalltrace {_metadata_version(_wheel(builds.release))}"


def test_twine_check_passes(builds: Builds) -> None:
    files = sorted(str(p) for p in builds.release.iterdir())
    assert len(files) == 2, files  # the sdist and the wheel
    out = _run([sys.executable, "-m", "twine", "check", "--strict", *files], cwd=builds.clone)
    assert out.count("PASSED") == 2, out
