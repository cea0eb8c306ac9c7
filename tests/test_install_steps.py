"""The Windows route of docs/install.md cannot rot (issue 33; review 2026-11-26 learner §3): its PowerShell lines
are read from the page, their flags compared with the Makefile's `make lab`, and their Python part — the Python
check, the venv, the three `pip install`s and `python -m jupyterlab --version` — run here on Linux.

Downloading torch (200 MB to 4.7 GB) in a test is out of the question, so the new venv also sees this test run's
own site-packages (a .pth file): `pip install torch==2.13.0` and JupyterLab are then "already satisfied" by the
tested releases, while the course itself is really installed — editable, compat mode — into the new venv.
`pip install --upgrade pip` and the course's build step (setuptools in pip's isolated build environment) use the
package index, as on a learner's machine."""
import re
import shutil
import site
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def powershell_lines() -> list[str]:
    text = (ROOT / "docs" / "install.md").read_text()
    block = re.search(r"^## Windows.*?```powershell\n(.*?)```", text, re.S | re.M)
    assert block, "docs/install.md: no ```powershell block under '## Windows'"
    return [l.strip() for l in block.group(1).splitlines() if l.strip()]


def _make_var(name: str) -> str:
    return re.search(rf"^{name}\s*:?=\s*(.*)$", (ROOT / "Makefile").read_text(), re.M).group(1).strip()


def test_the_windows_steps_do_what_make_lab_does():
    lines = powershell_lines()
    py = re.compile(r"^py -3\.1[0-4] ")
    assert py.match(lines[0]) and lines[0].endswith(r"tools\check_python.py .venv")     # the check comes first
    assert py.match(lines[1]) and lines[1].endswith("-m venv .venv")
    pip = [l for l in lines if r".venv\Scripts\python -m pip install" in l]
    assert pip[0].endswith("install --upgrade pip")
    assert pip[1].endswith(f"install torch=={_make_var('TORCH_VERSION')}")
    assert pip[2].endswith(f'install {_make_var("EDITABLE")} -e ".[lab]"')
    env = _make_var("LAB_ENV")                                                   # JUPYTER_CONFIG_DIR=.jupyter
    key, value = env.split("=")
    assert f'$env:{key} = "{value}"' in lines
    lab = next(l for l in lines if r".venv\Scripts\python -m jupyterlab" in l)
    assert lab == lines[-1]
    for flag in _make_var("LAB_FLAGS").split() + ["--no-browser"]:
        assert flag in lab.split(), flag


def _linux(line: str, python: str) -> list[str] | None:
    """One PowerShell line as the Linux command it stands for (None: not a command, e.g. `$env:`)."""
    if line.startswith("$env:"):
        return None
    line = re.sub(r"^py -3\.1\d ", f"{python} ", line).replace(r".venv\Scripts\python", ".venv/bin/python")
    line = line.replace("\\", "/").replace('".[lab]"', ".[lab]")
    if "-m jupyterlab" in line:
        line = line.split("-m jupyterlab")[0] + "-m jupyterlab --version"
    return line.split()


def test_the_windows_steps_python_part_runs(tmp_path):
    course = tmp_path / "attn_course"                     # a checkout named like the package (issue 23)
    course.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, course / name)
    for folder in ("attn_course", "tools"):
        shutil.copytree(ROOT / folder, course / folder, ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["JUPYTER_CONFIG_DIR"] = ".jupyter"
    lines = powershell_lines()
    for n, line in enumerate(lines):
        cmd = _linux(line, sys.executable)
        if cmd is None:
            continue
        if cmd[0].startswith(".venv/bin/python") and "pip" in cmd and not (course / ".venv" / "base.pth").exists():
            sp = subprocess.run([".venv/bin/python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                cwd=course, capture_output=True, text=True, check=True).stdout.strip()
            (Path(sp) / "_attn_course_test_base.pth").write_text("\n".join(site.getsitepackages()) + "\n")
            (course / ".venv" / "base.pth").touch()
        res = subprocess.run(cmd, cwd=course, env=env, capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, f"{line}\n-> {' '.join(cmd)}\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}"
        if "torch==" in line:
            assert "Requirement already satisfied: torch==2.13.0" in res.stdout, res.stdout[-500:]
        if "jupyterlab" in line:
            assert re.fullmatch(r"\d+\.\d+\.\d+\S*", res.stdout.strip()), res.stdout
    # the venv is the new one, made by this Python; the course is the copy, found from the checkout's parent
    probe = subprocess.run([str(course / ".venv" / "bin" / "python"), "-c",
                            "import sys, attn_course; from attn_course import attention; "
                            "print(sys.prefix); print(attn_course.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr
    prefix, init = probe.stdout.split()
    assert Path(prefix) == course / ".venv" and Path(init) == course / "attn_course" / "__init__.py"
    # and the first line refuses this venv when run by another Python version
    (course / ".venv" / "pyvenv.cfg").write_text("version = 3.9.18\n")
    res = subprocess.run(_linux(lines[0], sys.executable), cwd=course, env=env, capture_output=True, text=True)
    assert res.returncode == 1 and "made by Python 3.9" in res.stderr
