"""tests/device_probe.py (the IPython startup file `make test-notebooks` / `make test-portable` give every
notebook kernel) catches, on a CPU, the GPU bug of a module on `device` called with a tensor a cell created
without a device — and lets the correct patterns through. Runs one real kernel (nbclient), as nbval does."""
import shutil
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]

# (cell source, expected: None = runs, or a substring of the error)
CASES = [
    ("import torch\nfrom torch import nn\nimport helper\ndevice = torch.device('cpu')\n"
     "model = nn.Linear(4, 4).to(device)", None),
    ("model(torch.randn(2, 4))", "Linear was moved to `device`"),                         # the lesson-07 bug
    ("x = torch.zeros(2, 4)\ny = model(x)", "`x = torch.zeros(2, 4)`"),                 # names the creating line
    ("model(input=torch.ones(2, 4))", "created without `device=`"),                     # keyword input
    ("model(torch.randn(2, 4).to(torch.float32))", "created without"),                  # a dtype is not a device
    ("seq = nn.Sequential(nn.Linear(4, 4)).to(device)\nseq[0](torch.rand(1, 4))", "Linear was moved"),  # submodules
    ("model(torch.randn(2, 4, device=device))", None),                                  # created on device
    ("model(torch.randn(2, 4).to(device))", None),                                      # moved to device
    ("model(torch.randn(2, 4, device=device) * torch.tensor(2.0))", None),              # 0-d tensors are fine
    ("model(helper.make())", None),                                                     # a library's tensor
    ("kept = nn.Linear(4, 4)\nkept(torch.randn(2, 4))", None),                          # never moved: CPU on purpose
    ("model.cpu()\nmodel(torch.randn(2, 4))", None),                                    # moved back by the cell
    ("def batch():\n    return torch.randn(3, 4)\nmodel.to(device)(batch())", "return torch.randn(3, 4)"),
    # a device context still places the wrapped factories' tensors (lesson 12 counts FLOPs on "meta")
    ("with torch.device('meta'):\n    t = [torch.randn(2), torch.zeros(2), torch.arange(3), torch.empty(1)]\n"
     "assert {x.device.type for x in t} == {'meta'}, [x.device for x in t]", None),
]


def _execute(tmp: Path, sources: list[str]):
    """Execute cells in a fresh kernel whose IPYTHONDIR holds the probe as a startup file (as `make` sets up)."""
    startup = tmp / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "tests" / "device_probe.py", startup / "00-attn-course-device-probe.py")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in sources])
    mp = pytest.MonkeyPatch()
    mp.setenv("IPYTHONDIR", str(tmp / "ipython"))
    try:
        NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True,
                       resources={"metadata": {"path": str(tmp)}}).execute()
    finally:
        mp.undo()
    return nb


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("probe")
    (tmp / "helper.py").write_text("import torch\n\ndef make():\n    return torch.randn(2, 4)\n")
    return _execute(tmp, [src for src, _ in CASES])


@pytest.mark.parametrize("i", range(len(CASES)), ids=lambda i: CASES[i][0].splitlines()[-1][:40])
def test_probe_flags_exactly_the_unplaced_tensors(executed, i):
    src, expected = CASES[i]
    errors = [o for o in executed.cells[i].outputs if o.output_type == "error"]
    if expected is None:
        assert not errors, f"{src!r} should run, got {[e.ename + ': ' + e.evalue for e in errors]}"
    else:
        assert errors and errors[0].ename == "RuntimeError", f"{src!r} should fail the device check"
        assert expected in errors[0].evalue, errors[0].evalue


def test_probe_prints_nothing_and_leaves_no_names(tmp_path):
    """nbval compares outputs: the startup file adds none, and no names to the notebook's namespace."""
    nb = _execute(tmp_path, ["print(sorted(k for k in globals() if not k.startswith('_') and k not in "
                             "('In', 'Out', 'get_ipython', 'exit', 'quit', 'open')))",
                             "import torch\nprint(getattr(torch.randn, '_attn_course_probe', False))"])
    assert [o.text.strip() for c in nb.cells for o in c.outputs] == ["[]", "True"]


def test_make_runs_the_notebooks_with_the_probe():
    make = (ROOT / "Makefile").read_text()
    assert "IPYTHONDIR=$(CURDIR)/$(PROBE_DIR)" in make and "cp tests/device_probe.py $@" in make
    for target in ("test-notebooks", "test-portable"):
        recipe = make.split(f"\n{target}:", 1)[1].split("\n\n", 1)[0]
        assert "$(PROBE)" in recipe.splitlines()[0] and "$(DEVICE_PROBE)" in recipe, target
