"""The two distributions: one import namespace, nothing of bench/ or tests/, an SDK alone.

Builds both wheels from this checkout (pip, isolated builds) and installs the SDK's wheel into
a fresh virtualenv of its own, as a user of the SDK would.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVER_FOLDERS = ("server", "billing", "migrations", "experiments")

pytestmark = pytest.mark.packaging


def _build_wheel(source: Path, out: Path) -> Path:
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(out), str(source)],
        check=True,
        timeout=600,
        capture_output=True,
        text=True,
    )
    # setuptools warns of a folder it would leave out; an install prints that to a newcomer.
    assert "would be ignored" not in built.stdout + built.stderr
    name = "inference_auctions_sdk" if source.name == "sdk" else "inference_auctions-"
    return next(p for p in out.glob("*.whl") if p.name.startswith(name))


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("wheels")
    # The SDK is built from a copy: an in-tree build would leave build/ inside sdk/.
    sdk_copy = tmp_path_factory.mktemp("source") / "sdk"
    shutil.copytree(ROOT / "sdk", sdk_copy, ignore=shutil.ignore_patterns("__pycache__", "build"))
    return {"server": _build_wheel(ROOT, out), "sdk": _build_wheel(sdk_copy, out)}


def _files(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        return [name for name in archive.namelist() if ".dist-info/" not in name]


@pytest.mark.parametrize("distribution", ["server", "sdk"])
def test_a_wheel_holds_only_the_project_namespace(
    wheels: dict[str, Path], distribution: str
) -> None:
    files = _files(wheels[distribution])
    assert files
    assert {name.split("/")[0] for name in files} == {"inference_auctions"}
    # A namespace package shared by both distributions: neither may own its __init__.
    assert "inference_auctions/__init__.py" not in files
    assert not [name for name in files if "/bench/" in name or "/tests/" in name]


def test_the_server_wheel_holds_every_package_folder(wheels: dict[str, Path]) -> None:
    files = set(_files(wheels["server"]))
    for folder in SERVER_FOLDERS:
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.relative_to(ROOT).as_posix()
            assert f"inference_auctions/{relative}" in files, f"{relative} is not built"
        assert f"inference_auctions/{folder}/py.typed" in files or folder == "experiments"
    assert "inference_auctions/migrations/alembic.ini" in files
    for page in ("index.html", "app.js", "charts.js", "format.js", "style.css", "favicon.svg"):
        assert f"inference_auctions/server/dashboard/static/{page}" in files, page
    for part in (
        "swagger-ui-bundle.js",
        "swagger-ui.css",
        "favicon-32x32.png",
        "LICENSE",
        "NOTICE",
    ):
        assert f"inference_auctions/server/api/swagger_ui/{part}" in files, part
    assert not [name for name in files if name.startswith("inference_auctions/sdk/")]


def test_the_sdk_wheel_installs_alone_and_imports_nothing_of_the_server(
    wheels: dict[str, Path], tmp_path: Path
) -> None:
    env_dir = tmp_path / "sdk-venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", str(wheels["sdk"])],
        check=True,
        timeout=600,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    listed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format", "freeze"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    installed = {line.split("==")[0].lower() for line in listed.splitlines()}
    for heavy in ("fastapi", "sqlalchemy", "numpy", "matplotlib", "uvicorn", "psycopg"):
        assert heavy not in installed
    probe = (
        "import sys; from inference_auctions.sdk import AuctionClient, Budget;"
        "print(sorted(m for m in ('fastapi', 'sqlalchemy', 'numpy') if m in sys.modules))"
    )
    result = subprocess.run(
        [str(python), "-c", probe], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    assert result.stdout.strip() == "[]"


def test_the_sdk_tests_pass_with_only_the_sdk_wheel_installed(
    wheels: dict[str, Path], tmp_path: Path
) -> None:
    """The SDK's own tests, run from a virtualenv that holds the SDK's wheel and the test tools
    only, against real servers started from this (the server's) environment."""
    env_dir = tmp_path / "sdk-venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    # `openai`: docs/SDK.md shows OpenAI's own client against the server, and its test runs it.
    tools = ["pytest", "pytest-timeout", "hypothesis", "openai"]
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", str(wheels["sdk"]), *tools],
        check=True,
        timeout=600,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    # A copy of what the SDK's tests read, away from the checkout, whose folders would
    # otherwise shadow the installed wheel.
    work = tmp_path / "checkout"
    for part in (
        "tests/__init__.py",
        "tests/conftest.py",
        "tests/processes.py",
        "tests/virtual_time.py",
        "tests/sdk",
        "docs/SDK.md",
        "README.md",  # the SDK's first example runs for the user the README creates
        "pyproject.toml",
    ):
        source, target = ROOT / part, work / part
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, target)
    env = {**os.environ, "INFERENCE_AUCTION_TEST_SERVER_PYTHON": sys.executable}
    result = subprocess.run(
        [
            str(python),
            "-m",
            "pytest",
            "tests/sdk",
            "-p",
            "no:cacheprovider",
            # The simulations compare the bidder with the NumPy oracles of the benchmarks.
            "--ignore=tests/sdk/test_pacing_simulation.py",
            "-m",
            "not slow",
        ],
        check=False,
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    passed = re.search(r"(\d+) passed", result.stdout)
    assert passed is not None and int(passed.group(1)) >= 100, result.stdout[-2000:]
    probe = subprocess.run(
        [str(python), "-c", "import inference_auctions.sdk as s; print(s.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert str(env_dir) in probe.stdout


def test_an_editable_install_of_the_server_prints_no_setuptools_warning(tmp_path: Path) -> None:
    """`make` installs this checkout editable; setuptools warns of a layout it needs an import
    hook for, in every newcomer's first install."""
    env_dir = tmp_path / "editable-venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    # This environment's pip, new enough to show the build backend's warnings.
    pip = [sys.executable, "-m", "pip", "--python", str(env_dir / "bin" / "python")]
    installed = subprocess.run(
        [*pip, "install", "--no-deps", "-e", str(ROOT)],
        check=True,
        timeout=600,
        capture_output=True,
        text=True,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    output = installed.stdout + installed.stderr
    assert "Editable installation" not in output and "Warning" not in output, output
    probe = subprocess.run(
        [str(env_dir / "bin" / "python"), "-c", "import inference_auctions.server as s; print(s)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert str(ROOT / "inference_auctions" / "server") in probe.stdout
