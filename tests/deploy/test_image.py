"""The container image, built and run: its server answers bids and drains them on SIGTERM.

Marked `deploy`: building the image takes minutes, so `make test` leaves it out; `make
test-deploy` (or `pytest -m deploy`) runs deploy/check-image.sh, which needs podman.
BASE_IMAGE chooses the base (deploy/make-base-image.sh makes one from Debian's packages
where no registry can be reached).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "deploy" / "check-image.sh"


@pytest.mark.deploy
@pytest.mark.timeout(1800)
def test_the_image_serves_bids_and_drains_them_on_sigterm() -> None:
    if shutil.which("podman") is None and "PODMAN" not in os.environ:
        pytest.fail("podman is not installed (apt-get install podman)", pytrace=False)
    result = subprocess.run([str(SCRIPT)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "answered 200 through the drain" in result.stdout
