"""A real headless browser for the page tests: Debian's `chromium` and `chromium-driver`, driven
by Selenium. When they are missing, `chromium_driver` installs them with apt-get if it may (root);
otherwise the test skips, or fails under CI=true (a green CI must mean the browser ran)."""
from __future__ import annotations

import copy
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from helpers.env import in_ci, require

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
PACKAGES = ("chromium", "chromium-driver")
# Flags that work in containers without a display or a user namespace, and keep the browser
# from reaching out (updates, sync, QUIC probes).
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1000,1500")


def artifacts_dir() -> Path:
    """Where screenshots go: $CLARIFYJAX_ARTIFACTS, else artifacts/ in the working directory (a
    test's own temporary folder: tests never write the checkout)."""
    folder = Path(os.environ.get("CLARIFYJAX_ARTIFACTS", Path.cwd() / "artifacts"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _installed() -> bool:
    return os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)


def ensure_chromium() -> None:
    if _installed():
        return
    why = f"{CHROMIUM} / {CHROMEDRIVER} missing"
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        for cmd in (["apt-get", "update", "-q"],
                    ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]):
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
            if proc.returncode != 0:
                why += f"; {' '.join(cmd)} failed: {proc.stderr.strip()[-500:]}"
                break
        if _installed():
            return
    else:
        why += " (not root, so apt-get cannot install them)"
    message = f"a headless browser is needed: {why}; apt-get install {' '.join(PACKAGES)}"
    if in_ci():
        pytest.fail(message + " (CI=true: a missing browser is a failure)")
    pytest.skip(message)


def chromium_driver(profile: Path, extra_flags: Sequence[str] = ()):
    """A new headless Chromium session with the fresh profile folder `profile` (the caller quits
    it); `extra_flags` are added to FLAGS (e.g. ``--host-resolver-rules=MAP evil.test
    127.0.0.1``, a name of another site that resolves to this machine)."""
    ensure_chromium()
    webdriver = require("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, *extra_flags):
        options.add_argument(flag)
    # A loaded machine can take minutes to start Chromium; one more try with a new profile (the
    # first may be half-written) before the test fails.
    for attempt in range(2):
        attempt_options = copy.deepcopy(options)
        attempt_options.add_argument(f"--user-data-dir={profile}-{attempt}")
        try:
            return webdriver.Chrome(service=Service(CHROMEDRIVER), options=attempt_options)
        except Exception as e:  # selenium's WebDriverException, urllib3's ReadTimeoutError
            if attempt:
                raise
            print(f"Chromium did not start ({type(e).__name__}: {str(e)[:200]}); trying again")
