"""Fixtures of the browser tests: one JupyterLab server and one headless Chromium per session.

Skipped with a one-line reason where no Chromium is installed, unless ``ATTN_COURSE_REQUIRE_BROWSER=1``
(set by ``.ci/run``, which installs Debian's chromium), where a missing browser is a failure.
Screenshots go to ``$ATTN_COURSE_ARTIFACTS`` (default ``build/browser``; not committed).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from .lab import REPO, Lab, copy_course, find_chromium

ARTIFACTS = Path(os.environ.get("ATTN_COURSE_ARTIFACTS", REPO / "build" / "browser"))


def pytest_collection_modifyitems(config, items):
    if find_chromium() is not None:
        return
    reason = "no Chromium found (apt-get install chromium, or set ATTN_COURSE_CHROMIUM)"
    if os.environ.get("ATTN_COURSE_REQUIRE_BROWSER") == "1":
        raise pytest.UsageError(f"ATTN_COURSE_REQUIRE_BROWSER=1 but {reason}")
    for item in items:
        if "tests/browser" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    with Lab(copy_course(tmp_path_factory.mktemp("course"))) as server:
        yield server


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        # --no-sandbox: CI boxes run as root, where Chromium's sandbox refuses to start
        b = p.chromium.launch(executable_path=find_chromium(), args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()
