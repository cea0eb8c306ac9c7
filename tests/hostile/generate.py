"""Hostile (and honest) submissions for exercise set 01, built from the trusted solutions notebook.

``build(dest, pids_dir)`` writes the notebooks into ``dest`` and returns the points each one must earn
per exercise (None: the file must be reported as an error row). Each attack targets named exercises; the
other exercises of the same notebook keep honest solutions and must keep their points.
"""
from __future__ import annotations

import json
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = ROOT / "solutions" / "01_scaled_dot_product_attention.ipynb"
EXERCISES = ROOT / "exercises" / "01_scaled_dot_product_attention.ipynb"
IDS = ["01_attention_by_hand", "01_causal_padding_mask", "01_predict_shapes", "01_fix_the_bug", "01_score_std"]
FULL = dict(zip(IDS, [3, 2, 1, 2, 1]))

CRASH_AT_DEFINITION = '''
def predict_shapes(q_shape, k_shape, v_shape):
    return (0,), (0,)

import os
os._exit(3)                          # the whole process dies while this cell runs
'''
SEGFAULT = '''
def score_std(d_k):
    import ctypes
    ctypes.string_at(0)              # segmentation fault when called
'''
FORK_SLEEPERS = '''
import os, time
for _ in range(8):                   # bounded "fork bomb": sleepers that must not outlive the grading
    if os.fork() == 0:
        open(os.path.join(PIDS_DIR, str(os.getpid())), "w").close()
        time.sleep(120)
        os._exit(0)
'''
MEMORY_BOMB = '''
def make_mask(lengths, L):
    hog = []
    while True:                      # 512 MiB a time until the address-space limit stops it
        hog.append(torch.empty(2**27))
'''
HANG = '''
def fixed_attention(q, k, v, mask):
    while True:
        pass
'''
TENSOR_SUBCLASS = '''
class Liar(torch.Tensor):
    """Claims to equal everything."""
    def __eq__(self, other):
        return True
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ("allclose", "equal", "isclose"):
            return True
        return super().__torch_function__(func, types, args, kwargs or {})

def my_attention(q, k, v, mask=None):
    B, H, Lq, Lk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    return (torch.zeros(B, H, Lq, v.shape[-1]).as_subclass(Liar),
            torch.zeros(B, H, Lq, Lk).as_subclass(Liar))
'''
DICT_SUBCLASS = '''
class AlwaysEqual(dict):
    def __eq__(self, other):
        return True

def make_mask(lengths, L):
    return AlwaysEqual(mask=True)
'''
TAMPER = '''
import sys, torch
import attn_course.grading.spec as spec
from attn_course.grading.exercises import get
torch.allclose = lambda *a, **k: True
torch.equal = lambda *a, **k: True
spec.close = lambda *a, **k: True
spec.validate = lambda *a, **k: None
def check(*args, **kwargs):
    print("✓ all cases passed: 1/1 points")
ex = get("01_predict_shapes")
ex.answer_fn = lambda obj, case: {"out_shape": torch.zeros(4, dtype=torch.int64),
                                  "weights_shape": torch.zeros(4, dtype=torch.int64)}
ex.judge_fn = lambda *a: spec.Verdict(True)
import os                            # fake a finished run with "answers" for every exercise
out = os.path.join(sys.argv[-1], "out")
if os.path.isdir(out):
    open(os.path.join(out, "done"), "w").write("done")

def predict_shapes(q_shape, k_shape, v_shape):
    return (1, 1, 1, 1), (1, 1, 1, 1)
'''
SPOOFED_CLASS = '''
class NotATensor:
    __class__ = torch.Tensor             # isinstance(NotATensor(), torch.Tensor) is True
    def __init__(self, shape):
        self.shape, self.dtype = shape, torch.float32

def fixed_attention(q, k, v, mask):
    return NotATensor((*q.shape[:-1], v.shape[-1]))
'''
FAKE_SUCCESS = '''
import os
print("Score: 9/9 — all exercises passed. grades.csv written.")
FAKE = "student_id,total,max_score\\ncheater,100,9\\n"
for d in (".", ".."):
    try:
        with open(os.path.join(d, "grades.csv"), "w") as f:
            f.write(FAKE)
    except OSError:
        pass
try:                                     # the grader's --out folder, read from its command line
    args = open(f"/proc/{os.getppid()}/cmdline").read().split("\\0")
    target = os.path.join(f"/proc/{os.getppid()}/cwd", args[args.index("--out") + 1])
    os.makedirs(target, exist_ok=True)
    for name in ("grades.csv", "cheater.json"):
        with open(os.path.join(target, name), "w") as f:
            f.write(FAKE)
except Exception:
    pass

def score_std(d_k):
    return 0.0, 0.0
'''
SDPA_DIRECT = '''
def my_attention(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask).nan_to_num(0.0)
    return out, weights
'''
SDPA_OBFUSCATED = '''
def fixed_attention(q, k, v, mask):
    fn = getattr(torch.nn.functional, "scaled_dot_" + "product_attention")
    return fn(q, k, v, attn_mask=mask)
'''
COURSE_OBFUSCATED = '''
def make_mask(lengths, L):
    m = __import__("attn" + "_course.ma" + "sks", fromlist=["x"])
    return m.combine(m.causal_mask(L), m.padding_mask(lengths, L))
'''
# Reading the trusted solutions notebook from disk (the path is easy to find from the package), with
# Python or with another program, and calling the grader's own reference function.
READ_SOLUTIONS = '''
import glob, json, os, importlib
_root = os.path.dirname(os.path.dirname(importlib.import_module("attn" + "_course").__file__))
for _c in json.load(open(glob.glob(os.path.join(_root, "solu" + "tions", "01_*"))[0]))["cells"]:
    if _c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "01_attention_by_hand":
        exec("".join(_c["source"]))
'''
CAT_SOLUTIONS = '''
import glob, json, os, subprocess, importlib
_root = os.path.dirname(os.path.dirname(importlib.import_module("attn" + "_course").__file__))
_text = subprocess.run("cat " + os.path.join(_root, "solu" + "tions", "01_*"), shell=True,
                       capture_output=True, text=True).stdout
for _c in json.loads(_text)["cells"]:
    if _c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "01_fix_the_bug":
        exec("".join(_c["source"]))
'''
CALL_REFERENCE = '''
import importlib
_ref = importlib.import_module("attn" + "_course.grading.exercises.lesson01")
def make_mask(lengths, L):
    return _ref._mask_expected(_ref.Case("x", {"lengths": lengths}, {"L": L}))["mask"]
'''
NOISE = '''
import sys, warnings
print("debugging output " * 20)
sys.stderr.write("some stderr noise\\n")
warnings.warn("a learner warning")
'''


def _honest() -> dict[str, str]:
    nb = nbformat.read(str(SOLUTIONS), as_version=4)
    return {c.metadata["nbgrader"]["grade_id"]: "".join(c.source) for c in nb.cells
            if c.cell_type == "code" and "nbgrader" in c.metadata}


def _with_cells(sources: dict[str, str], base: Path = EXERCISES):
    """The released notebook with the given exercise cells filled in (others keep their stub)."""
    nb = nbformat.read(str(base), as_version=4)
    for c in nb.cells:
        gid = c.metadata.get("nbgrader", {}).get("grade_id")
        if gid in sources:
            c.source = sources[gid]
    return nb


def build(dest: Path, pids_dir: Path) -> dict[str, dict[str, float] | None]:
    dest.mkdir(parents=True, exist_ok=True)
    honest = _honest()
    expected: dict[str, dict[str, float] | None] = {}

    def write(name: str, sources: dict[str, str], points: dict[str, float], nb=None):
        nb = nb if nb is not None else _with_cells({**honest, **sources})
        nbformat.write(nb, str(dest / f"{name}.ipynb"))
        expected[name] = points

    write("crasher", {"01_predict_shapes": CRASH_AT_DEFINITION, "01_score_std": SEGFAULT},
          {**FULL, "01_predict_shapes": 0, "01_score_std": 0})
    write("hog", {"01_attention_by_hand": f"PIDS_DIR = {str(pids_dir)!r}\n" + FORK_SLEEPERS
                  + honest["01_attention_by_hand"],
                  "01_causal_padding_mask": MEMORY_BOMB, "01_fix_the_bug": HANG},
          {**FULL, "01_attention_by_hand": 0, "01_causal_padding_mask": 0, "01_fix_the_bug": 0})   # fork: refused
    write("cheater", {"01_attention_by_hand": TENSOR_SUBCLASS, "01_causal_padding_mask": DICT_SUBCLASS,
                      "01_predict_shapes": TAMPER, "01_fix_the_bug": SPOOFED_CLASS, "01_score_std": FAKE_SUCCESS},
          dict.fromkeys(IDS, 0))
    write("forbidden", {"01_attention_by_hand": SDPA_DIRECT, "01_fix_the_bug": SDPA_OBFUSCATED,
                        "01_causal_padding_mask": COURSE_OBFUSCATED},
          {**FULL, "01_attention_by_hand": 0, "01_fix_the_bug": 0, "01_causal_padding_mask": 0})

    # honest work with prints and warnings, in a notebook whose metadata, order and check cells were
    # tampered with: points, tags and check cells in the submission change nothing.
    nb = _with_cells({gid: NOISE + src for gid, src in honest.items()})
    for c in nb.cells:
        if c.cell_type == "code" and "nbgrader" in c.metadata:
            c.metadata["nbgrader"]["points"] = 100
            c.metadata["tags"] = ["raises-exception", "skip"]
        elif c.cell_type == "code" and c.source.startswith("check("):
            c.source = 'print("9/9 points")'
    ex_cells = [c for c in nb.cells if "nbgrader" in c.metadata]
    nb.cells = [c for c in nb.cells if "nbgrader" not in c.metadata] + ex_cells[::-1]
    nb.cells.append(nbformat.v4.new_code_cell("my_attention = None\nraise SystemExit"))
    write("honest_noisy", {}, dict(FULL), nb=nb)

    write("reader", {"01_attention_by_hand": READ_SOLUTIONS, "01_fix_the_bug": CAT_SOLUTIONS,
                     "01_causal_padding_mask": CALL_REFERENCE},
          {**FULL, "01_attention_by_hand": 0, "01_fix_the_bug": 0, "01_causal_padding_mask": 0})
    write("solution_copy", {}, dict(FULL), nb=nbformat.read(str(SOLUTIONS), as_version=4))
    write("untouched", {}, dict.fromkeys(IDS, 0), nb=nbformat.read(str(EXERCISES), as_version=4))
    (dest / "notes.txt").write_text("not a notebook\n")
    expected["notes"] = None
    (dest / "broken.ipynb").write_text('{"cells": [')
    expected["broken"] = None
    (dest / "empty.ipynb").write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4,
                                                  "nbformat_minor": 5}))
    expected["empty"] = None
    return expected

