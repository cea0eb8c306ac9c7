"""Lesson 08 runs to its end without Triton (a CPU-only torch, macOS, Windows, an install without the triton
extra): Triton is made unimportable — a `triton` package on PYTHONPATH whose import raises
ModuleNotFoundError, as a missing one does — and the whole lesson is executed in a real kernel."""
import os
import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
LESSON = ROOT / "notebooks" / "08_flash_attention_tiling.ipynb"


def test_lesson_08_runs_to_the_end_without_triton(tmp_path):
    fake = tmp_path / "no_triton" / "triton"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'triton'\", name='triton')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(fake.parent), os.environ.get("PYTHONPATH")]))}
    env.pop("TRITON_INTERPRET", None)
    probe = subprocess.run([sys.executable, "-c", "import triton"], env=env, capture_output=True, text=True)
    assert probe.returncode != 0 and "No module named 'triton'" in probe.stderr
    out = tmp_path / "run.ipynb"
    r = subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
                        "--ExecutePreprocessor.timeout=600", "--output", str(out), str(LESSON)],
                       cwd=LESSON.parent, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    nb = nbformat.read(out, as_version=4)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "Triton is not installed here" in text and "| forward | A100 (sm_80) |" in "\n".join(
        str(o.get("data", {}).get("text/plain", "")) + o.get("text", "") for c in nb.cells for o in c.get("outputs", []))


def test_solutions_08_run_without_triton(tmp_path):
    """The exercise notebook's solutions need no Triton either (exercises/08 is generated from it)."""
    fake = tmp_path / "no_triton" / "triton"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'triton'\", name='triton')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(fake.parent), os.environ.get("PYTHONPATH")]))}
    env.pop("TRITON_INTERPRET", None)
    sol = ROOT / "solutions" / LESSON.name
    out = tmp_path / "sol.ipynb"
    r = subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
                        "--ExecutePreprocessor.timeout=600", "--output", str(out), str(sol)],
                       cwd=sol.parent, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    nb = nbformat.read(out, as_version=4)
    assert not [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert all(c.outputs for c in nb.cells if c.cell_type == "code" and "check(" in c.source)
