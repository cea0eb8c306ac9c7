"""Every notebook follows `device`: its setup cell picks CUDA when `torch.cuda.is_available()` (and installs
the pinned package only when it is missing), and no code cell hard-codes the CPU (or CUDA) for work that
should run on `device`. Moving results to the CPU for plotting (`.cpu()`) is fine, and `.numpy()` must come
after it. (The runtime half — a module on `device` fed a tensor created without one — is tests/device_probe.py,
which every nbval run of `make test-notebooks` / `make test-portable` loads.)"""
import importlib.util
import json
import re
import subprocess
from pathlib import Path
from unittest import mock

import pytest
import torch

from attn_course import _colab

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for d in ("notebooks", "solutions", "exercises") for p in (ROOT / d).glob("*.ipynb"))
SETUP_MARKER = 'find_spec("attn_course")'
# `device="cpu"`, `torch.device("cpu")`, `.to("cpu")`, `.cuda()`, `device="cuda"`: placement that ignores `device`
HARD_CODED = re.compile(r"""device\s*=\s*["'](?:cpu|cuda)["']|torch\.device\(\s*["'](?:cpu|cuda)["']\s*\)"""
                        r"""|\.to\(\s*["'](?:cpu|cuda)["']\s*\)|\.cuda\(\)""")


def _code_cells(path):
    return ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


def _setup_source(path):
    setup = [src for src in _code_cells(path) if SETUP_MARKER in src]
    assert setup, f"{path.name}: no setup cell"
    return setup[0]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
@pytest.mark.parametrize("cuda", [True, False])
def test_setup_cell_follows_cuda_availability_without_installing(path, cuda):
    ns = {}
    with mock.patch.object(torch.cuda, "is_available", return_value=cuda), \
            mock.patch.object(subprocess, "run", side_effect=AssertionError("pip must not run")):
        exec(compile(_setup_source(path), f"{path.name}:setup", "exec"), ns)
    assert ns["device"] == torch.device("cuda" if cuda else "cpu")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_setup_cell_installs_the_pinned_package_when_missing(path):
    calls, ns = [], {}
    real_find_spec = importlib.util.find_spec
    with mock.patch.object(importlib.util, "find_spec",
                           side_effect=lambda name, *a: None if name == "attn_course" else real_find_spec(name, *a)), \
            mock.patch.object(subprocess, "run",
                              side_effect=lambda cmd, **kw: calls.append(cmd) or subprocess.CompletedProcess(cmd, 0)), \
            mock.patch.object(torch.cuda, "is_available", return_value=False):
        exec(compile(_setup_source(path), f"{path.name}:setup", "exec"), ns)
    assert len(calls) == 1 and calls[0][-1] == _colab.install_spec(), calls


@pytest.mark.parametrize("path", NOTEBOOKS[:1] + NOTEBOOKS[-1:], ids=lambda p: f"{p.parent.name}/{p.name}")
def test_setup_cell_says_what_to_do_when_pip_fails(path):
    """No network, or the course not published yet: the learner reads what to do, not pip's raw error alone."""
    real_find_spec = importlib.util.find_spec
    with mock.patch.object(importlib.util, "find_spec",
                           side_effect=lambda name, *a: None if name == "attn_course" else real_find_spec(name, *a)), \
            mock.patch.object(subprocess, "run", side_effect=lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1)), \
            pytest.raises(RuntimeError, match="pip could not install the course package.*make lab"):
        exec(compile(_setup_source(path), f"{path.name}:setup", "exec"), {})


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_code_cell_hard_codes_a_device(path):
    offending = [line.strip() for src in _code_cells(path) if SETUP_MARKER not in src
                 for line in src.splitlines() if HARD_CODED.search(line)]
    assert not offending, f"{path.name}: use `device` instead of {offending}"


def test_the_pattern_catches_hard_coded_devices_and_allows_device_and_cpu_for_plotting():
    bad = ['q = torch.randn(4, device="cpu")', "x = x.to('cpu')", 'dev = torch.device("cpu")', "m.cuda()",
           'bench.measure("flash", L=64, device="cuda")']
    good = ["q = torch.randn(4, device=device)", "w = w.cpu()", 'if device.type == "cuda":', "model.to(device)"]
    assert all(HARD_CODED.search(s) for s in bad) and not any(HARD_CODED.search(s) for s in good)


def _numpy_without_cpu(line: str) -> list[str]:
    """Every ``X.numpy()`` in ``line`` whose expression X does not pass through ``.cpu()`` (on a CUDA tensor
    ``.numpy()`` raises; ``.cpu()`` is free on a CPU tensor). X is the chain of names, calls and subscripts
    right before ``.numpy()``."""
    offending = []
    for m in re.finditer(r"\.numpy\(\)", line):
        i, depth = m.start(), 0
        while i > 0:
            ch = line[i - 1]
            if ch in ")]":
                depth += 1
            elif ch in "([":
                if depth == 0:
                    break
                depth -= 1
            elif depth == 0 and not (ch.isalnum() or ch in "_."):
                break
            i -= 1
        chain = line[i:m.end()]
        if ".cpu()" not in chain:
            offending.append(chain)
    return offending


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_numpy_only_after_cpu(path):
    offending = [chain for src in _code_cells(path) for line in src.splitlines() for chain in _numpy_without_cpu(line)]
    assert not offending, f"{path.name}: .numpy() needs .cpu() first (it raises on a CUDA tensor): {offending}"


def test_the_numpy_check_reads_the_whole_expression():
    assert _numpy_without_cpu("ax.bar(range(3), w[q, : q + 1].numpy())") == ["w[q, : q + 1].numpy()"]
    assert _numpy_without_cpu("plt.imshow(model(x)[0].detach().numpy())") == ["model(x)[0].detach().numpy()"]
    assert _numpy_without_cpu("a = w[q, : q + 1].cpu().numpy(); b = x.detach().cpu().numpy()") == []
    assert _numpy_without_cpu("n = np.asarray(t.cpu().numpy()) + u.numpy()") == ["u.numpy()"]
