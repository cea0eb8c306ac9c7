"""`make test-portable`'s environment reaches the notebook kernels: ATen dispatches to its baseline kernels
(no AVX2/AVX-512) and torch uses one thread — so the second configuration really is a second one."""
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]


def _portable_env() -> dict[str, str]:
    line = re.search(r"^PORTABLE_ENV\s*:=\s*(.*)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    return dict(item.split("=", 1) for item in line.split())


def test_a_kernel_started_with_the_portable_env_uses_baseline_kernels_and_one_thread(tmp_path):
    env = _portable_env()
    assert env == {"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import torch\nprint(torch.backends.cpu.get_cpu_capability(), torch.get_num_threads())")])
    mp = pytest.MonkeyPatch()
    for k, v in env.items():
        mp.setenv(k, v)
    try:
        NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    finally:
        mp.undo()
    assert nb.cells[0].outputs[0].text.split() == ["DEFAULT", "1"]
