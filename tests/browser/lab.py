"""A JupyterLab server and a headless Chromium for the browser tests (no network, nothing left behind).

The server runs from this interpreter's environment (the project's venv) on a free loopback port
with a generated token, serves a *copy* of the course (so a save or an autosave never touches the
checkout), and is always stopped with its whole process group. JupyterLab is told to expose its
application object (``window.jupyterapp``, as its own UI tests do), to render every cell (no
windowing, so every output is in the DOM) and not to autosave.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# The one image a lesson asks the internet for: the "Open in Colab" badge of every first cell.
# Offline, it is answered locally so that a missing network is not reported as a console error.
BADGE = "https://colab.research.google.com/assets/colab-badge.svg"
BADGE_SVG = ('<svg xmlns="http://www.w3.org/2000/svg" width="117" height="20">'
             '<rect width="117" height="20" fill="#555"/></svg>')


def find_chromium() -> str | None:
    """``$ATTN_COURSE_CHROMIUM`` or the first Chromium/Chrome on PATH (Debian: ``apt-get install chromium``)."""
    path = os.environ.get("ATTN_COURSE_CHROMIUM")
    if path:
        return path if Path(path).exists() else None
    for name in CHROMIUM_CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    """``with Lab(root) as lab:`` a running server; ``lab.url(path)`` opens ``path`` (relative to ``root``)."""

    def __init__(self, root: Path, *, flags: tuple[str, ...] = (), env: dict[str, str] | None = None,
                 timeout: float = 90.0):
        self.root, self.flags, self.env, self.timeout = Path(root), tuple(flags), dict(env or {}), timeout
        self.token = secrets.token_hex(16)
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.log = self.root / ".lab.log"

    def url(self, path: str | None = "") -> str:
        """``/lab/tree/<path>``, or with ``path=None`` the server's landing page (``/``)."""
        # reset: a fresh workspace, so notebooks of earlier tests are not reopened beside this one
        where = "" if path is None else f"lab/tree/{path}"
        return f"http://127.0.0.1:{self.port}/{where}?reset&token={self.token}"

    def __enter__(self) -> "Lab":
        settings = self.root / ".lab-settings"
        for plugin, values in {
            "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
            "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
            "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
        }.items():
            f = settings / f"{plugin}.jupyterlab-settings"
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(json.dumps(values))
        jupyter = Path(sys.executable).with_name("jupyter")
        cmd = [str(jupyter), "lab", "--no-browser", "--ip=127.0.0.1", f"--port={self.port}",
               "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
               "--LabApp.expose_app_in_browser=True",
               f"--LabApp.user_settings_dir={settings}", f"--LabApp.workspaces_dir={self.root / '.lab-ws'}",
               *self.flags]
        if not any(f.startswith("--ServerApp.root_dir=") for f in self.flags):
            cmd.append(f"--ServerApp.root_dir={self.root}")       # (relative roots resolve from cwd=root)
        if os.geteuid() == 0:
            cmd.append("--allow-root")
        env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(self.root / ".lab-runtime"), **self.env}
        env.pop("MPLBACKEND", None)                 # kernels keep the inline backend
        self.proc = subprocess.Popen(cmd, stdout=self.log.open("w"), stderr=subprocess.STDOUT,
                                     start_new_session=True, env=env, cwd=self.root)
        deadline = time.monotonic() + self.timeout
        status = f"http://127.0.0.1:{self.port}/api/status?token={self.token}"
        while True:
            if self.proc.poll() is not None:
                self.__exit__()
                raise RuntimeError(f"JupyterLab exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                urllib.request.urlopen(status, timeout=2).read()
                return self
            except OSError:
                if time.monotonic() > deadline:
                    self.__exit__()
                    raise TimeoutError(f"JupyterLab did not answer in {self.timeout:.0f} s: "
                                       f"{self.log.read_text()[-2000:]}")
                time.sleep(0.3)

    def __exit__(self, *exc):
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):   # server and its kernels
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue


def copy_course(dest: Path) -> Path:
    """The course's notebooks, exercises and solutions, copied (the server edits only the copy)."""
    for d in ("notebooks", "exercises", "solutions"):
        shutil.copytree(REPO / d, dest / d, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    shutil.copytree(REPO / ".jupyter", dest / ".jupyter")        # make lab's app settings
    shutil.copy(REPO / "README.md", dest / "README.md")
    return dest


def make_lab_flags() -> tuple[list[str], dict[str, str]]:
    """``make lab``'s ``LAB_FLAGS`` and ``LAB_ENV`` (read from the Makefile, so the test cannot drift)."""
    import re
    make = (REPO / "Makefile").read_text()
    var = lambda name: re.search(rf"^{name}\s*:?=\s*(.*)$", make, re.M).group(1).split()  # noqa: E731
    return var("LAB_FLAGS"), dict(kv.split("=", 1) for kv in var("LAB_ENV"))
