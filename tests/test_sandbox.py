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
    "flex": ("from torch.nn.attention.flex_attention import flex_attention\n    o = torch.ones(1, 1, 2, 2)\n"
             "    flex_attention(o, o, o)", "no fused attention kernels"),
    "numpy_gather": ("torch.arange(100000.0).numpy()[::2]", "data stays in torch"),
    "tensorbase_numpy": ("torch._C.TensorBase.numpy(torch.arange(100000.0))[::2]", "data stays in torch"),
    # small pieces add up: 4 blocks of 8 floats through numpy, or 64 floats one number at a time (review H14-1)
    "numpy_blocks": ("[torch.arange(8.0).numpy() for _ in range(4)]", "data stays in torch"),
    "float_items": ("[float(x) for x in torch.arange(64.0)]", "data stays in torch"),
    "sys_modules": ("import sys\n    sys.modules['attn_course'].attention", "no course modules"),
    "importlib": ("import importlib\n    importlib.import_module('attn_' + 'course.functional')", "no course modules"),
    "from_file": (f"import importlib.util\n    s = importlib.util.spec_from_file_location('f', {str(PKG / 'functional.py')!r})"
                  f"\n    s.loader.exec_module(importlib.util.module_from_spec(s))", "no course modules"),
}
BUILDS = sorted(i for i, ex in registry().items() if ex.kind == "build" and i in CELLS)


def wrapped(ex_id: str, exploit: str) -> str:
    """The suite's correct cell for ``ex_id``, its function wrapped so that it first runs ``exploit``."""
    name, correct = CELLS[ex_id][0], CELLS[ex_id][1]
    name = name.strip("()").split(",")[0].strip()          # a pair handed in (9.7): wrap its first function
    return correct + f"\n_right_{name} = {name}\n\ndef {name}(*args):\n    {exploit}\n    return _right_{name}(*args)\n"


def _allow(ex_id):
    import importlib
    return getattr(importlib.import_module(f"attn_course.grading.exercises.lesson{ex_id[:2]}"), "SANDBOX_ALLOW", ())


FUSED_OK = [i for i in BUILDS if sandbox.FUSED_OK in _allow(i)]      # lesson 11: SDPA may do the attention
REFUSED = [(i, e) for i in BUILDS for e in sorted(EXPLOITS)
           if not (i in FUSED_OK and EXPLOITS[e][1] == "no fused attention kernels")]


@pytest.mark.parametrize("ex_id, exploit", REFUSED)
def test_every_way_around_is_refused_with_its_rule(ex_id, exploit, capsys):
    code, rule = EXPLOITS[exploit]
    result = check_cell(ex_id, wrapped(ex_id, code))
    out = capsys.readouterr().out
    assert result.status == "forbidden" and result.score == 0, out
    assert f"rule: {rule}" in out, out


@pytest.mark.parametrize("ex_id", FUSED_OK)
def test_where_the_set_allows_fused_kernels_they_cost_nothing(ex_id, capsys):
    """SANDBOX_ALLOW's "fused attention kernels": the fused calls that are refused elsewhere pass here."""
    assert FUSED_OK, "lesson 11's exercise set allows SDPA"
    for exploit in ("aten_sdpa", "flash_for_cpu"):
        result = check_cell(ex_id, wrapped(ex_id, EXPLOITS[exploit][0]))
        assert result.status == "checked" and result.score == result.max_score, capsys.readouterr().out
    result = check_cell(ex_id, wrapped(ex_id, EXPLOITS["flex"][0]))      # a higher-order operator: never runs
    out = capsys.readouterr().out
    assert result.status == "forbidden" and "rule: forbidden operation" in out and "higher-order" in out, out


def test_the_grader_refuses_each_way_around_with_its_rule(tmp_path):
    """``attn-course grade``: three notebooks whose build cells each run one way around the sandbox (every rule,
    one batch) get 0 on those exercises, with the rule's name in the feedback; their other exercises still count."""
    import nbformat

    from attn_course.grading import notebook as nbk
    from attn_course.grading.runner import Options, grade_batch
    root = Path(__file__).resolve().parents[1]
    plan = {"01": ["thread", "subprocess"], "03": ["flash_for_cpu", "aten_sdpa"],
            "07": ["numpy_gather", "sys_modules", "importlib", "from_file"]}
    subs, want = tmp_path / "subs", {}
    subs.mkdir()
    for lesson, exploits in plan.items():
        path = next((root / "exercises").glob(f"{lesson}_*.ipynb"))
        nb = nbformat.read(path, as_version=4)
        exploit_of = dict(zip([i for i in BUILDS if i.startswith(lesson)], exploits, strict=True))
        for cell in nb.cells:
            gid = nbk.grade_id(cell)
            if gid in CELLS:
                cell.source = CELLS[gid][1]
                if gid in exploit_of:
                    cell.source = wrapped(gid, EXPLOITS[exploit_of[gid]][0])
                    want[gid] = EXPLOITS[exploit_of[gid]][1]
        nbformat.write(nb, str(subs / f"exploit_{lesson}.ipynb"))
    # check_settings=False: the solutions' own run (calibrate) is test_grading_notebooks.py's, for every lesson
    reports = grade_batch([subs], tmp_path / "out", Options(timeout=300, jobs=1), root=root, progress=False,
                          check_settings=False)
    seen = set()
    for r in reports:
        assert r["error"] is None, r["error"]
        for ex_id, e in r["exercises"].items():
            if ex_id in want:
                assert e["points"] == 0 and e["status"] == "forbidden", (ex_id, e["status"], e["notes"], e["cases"])
                assert f"rule: {want[ex_id]}" in " ".join(e["notes"]), (ex_id, e["notes"])
                seen.add(ex_id)
            else:
                assert e["points"] == e["max_points"], (ex_id, e)
    assert seen == set(want), seen
