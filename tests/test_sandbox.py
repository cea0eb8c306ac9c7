"""The sandbox (grading/sandbox.py): in every build exercise, each way around it is refused with its rule's name,
in check() and in ``attn-course grade``; the review's scripts, as learner cells, miss full marks."""
from pathlib import Path

import pytest

from attn_course.grading import sandbox
from attn_course.grading.exercises import registry
from learner_cells import CELLS
from test_grading_learners import check_cell

PKG = Path(sandbox.__file__).resolve().parents[1]
EXPLOITS = {
    "thread": ("import threading\n    threading.Thread(target=lambda: None).start()", "no threads or processes"),
    "subprocess": ("import subprocess\n    subprocess.run(['true'])", "no threads or processes"),
    "flash_for_cpu": ("o = torch.ones(1, 1, 2, 2)\n    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu("
                      "o, o, o, 0.0, False)", "no fused attention kernels"),
    "aten_sdpa": ("o = torch.ones(1, 1, 2, 2)\n    torch.ops.aten.scaled_dot_product_attention(o, o, o)",
                  "no fused attention kernels"),
    "numpy_gather": ("torch.arange(100000.0).numpy()[::2]", "data stays in torch"),
    "sys_modules": ("import sys\n    sys.modules['attn_course'].attention", "no course modules"),
    "importlib": ("import importlib\n    importlib.import_module('attn_' + 'course.functional')", "no course modules"),
    "from_file": (f"import importlib.util\n    s = importlib.util.spec_from_file_location('f', {str(PKG / 'functional.py')!r})"
                  f"\n    s.loader.exec_module(importlib.util.module_from_spec(s))", "no course modules"),
}
BUILDS = sorted(i for i, ex in registry().items() if ex.kind == "build" and i in CELLS)


def wrapped(ex_id: str, exploit: str) -> str:
    """The suite's correct cell for ``ex_id``, its function wrapped so that it first runs ``exploit``."""
    name, correct = CELLS[ex_id][0], CELLS[ex_id][1]
    return correct + f"\n_right = {name}\n\ndef {name}(*args):\n    {exploit}\n    return _right(*args)\n"


@pytest.mark.parametrize("ex_id", BUILDS)
@pytest.mark.parametrize("exploit", sorted(EXPLOITS))
def test_every_way_around_is_refused_with_its_rule(ex_id, exploit, capsys):
    code, rule = EXPLOITS[exploit]
    if rule == "no fused attention kernels" and sandbox.FUSED_OK in _allow(ex_id):
        pytest.skip(f"{ex_id}'s exercise set lets SDPA do the attention (SANDBOX_ALLOW)")
    result = check_cell(ex_id, wrapped(ex_id, code))
    out = capsys.readouterr().out
    assert result.status == "forbidden" and result.score == 0, out
    assert f"rule: {rule}" in out, out


def _allow(ex_id):
    import importlib
    return getattr(importlib.import_module(f"attn_course.grading.exercises.lesson{ex_id[:2]}"), "SANDBOX_ALLOW", ())
