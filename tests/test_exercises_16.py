"""Exercise set 16, the capstone (an open exercise): the course's design scores full marks, the released stub 0,
each typical failure loses the point the prompt says, and ``attn-course grade`` ranks a class on a leaderboard.

Most tests shorten the training recipe (monkeypatched steps) where the loss is not their point; the loss tests
and the end-to-end batch run the real recipe."""
import csv
import json
import linecache
import math
import re
import shutil
from pathlib import Path

import nbformat
import pytest
import torch
import torch.nn.functional as F

from attn_course.demos.textlm import TextData
from attn_course.gqa import KVCache
from attn_course.grading import check
from attn_course.grading import notebook as nbk
from attn_course.grading.cli import main as cli
from attn_course.grading.exercises import get, lesson16
from attn_course.grading import runner
from attn_course.grading.runner import leaderboard_rows
from attn_course.grading.selfcheck import exercise_seed, held_out_cases, held_out_seed
from exercise_kit import results
from learner_cells_16 import CELLS, FP16_KV, INT8_KV, SHORTCUTS, WINDOW_64, _ALIBI_MQA, _BIGRAM, _gqa

ROOT = Path(__file__).resolve().parents[1]
STEM = "16_capstone_tiny_language_model"
PARAMS, DECODE, KV, LOSS = range(4)           # the order of the four checks (one point each)


def cell(source: str):
    """``make_model`` defined by executing ``source`` as a notebook cell (its text in linecache, as IPython)."""
    name = f"<capstone-cell-{abs(hash(source))}>"
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    ns = {"__name__": "__main__", "torch": torch, "math": math}
    exec(compile(source, name, "exec"), ns)
    return ns["make_model"]


def solution_source() -> str:
    nb = nbk.read(ROOT / "solutions" / f"{STEM}.ipynb")
    cells = nbk.exercise_cells(nb)
    return "import torch.nn.functional as F\nfrom torch import nn\n" + nbk.source_of(cells["16_capstone"])


@pytest.fixture
def short(monkeypatch):
    """A 5-step recipe: fast, for tests whose point is not the loss (which then fails the bar)."""
    monkeypatch.setitem(lesson16.RECIPE, "steps", 5)


# ---- the measurement -------------------------------------------------------------------------------------

def test_cache_bytes_counts_every_storage_once():
    k, v = torch.zeros(1, 2, 10, 16), torch.zeros(1, 2, 10, 16, dtype=torch.float16)
    assert lesson16.cache_bytes([(k, v)]) == 10 * 32 * 4 + 10 * 32 * 2
    assert lesson16.cache_bytes({"a": [k, k], "b": (k,)}) == 10 * 32 * 4               # the same tensor once
    buf = torch.zeros(1, 2, 128, 16)
    assert lesson16.cache_bytes([buf[:, :, :10]]) == 128 * 32 * 4                      # a view holds its buffer
    cache = KVCache()
    cache.update(torch.zeros(1, 1, 7, 8), torch.zeros(1, 1, 7, 8))
    assert lesson16.cache_bytes([cache, 3, "x", None]) == 2 * 7 * 8 * 4                # a plain object's tensors
    assert lesson16.cache_bytes([torch.nn.Linear(4, 4), torch.nn.Parameter(torch.zeros(9))]) == 0
    # bytes whatever the dtype: int8 keys and values with their float32 scales count both
    kq, ks = torch.zeros(1, 2, 10, 16, dtype=torch.int8), torch.zeros(1, 2, 10, 1)
    assert lesson16.cache_bytes((5, [(kq, ks, kq.clone(), ks.clone())])) == 2 * (10 * 32 * 1 + 10 * 2 * 4)
    # a closure or a bound method in the cache is walked; what the model itself holds is not cache
    model = torch.nn.Linear(4, 4)
    model.register_buffer("table", torch.zeros(100))
    hidden = torch.zeros(50)
    assert lesson16.cache_bytes([lambda: hidden, model.table], model) == 50 * 4
    # Python numbers: the first FREE_NUMBERS are a position or settings, the rest 8 bytes each
    assert lesson16.cache_bytes([list(range(lesson16.FREE_NUMBERS + 10))]) == 10 * 8


_GLOBAL_TABLE = torch.zeros(300)


def test_every_number_the_model_reaches_counts():
    """The parameter count walks the object graph from the model and make_model: parameters, buffers, tensors in
    attributes and containers, closures, the globals the code names, bound methods, functools.partial — each
    storage once (a tied or viewed weight once), lists of numbers and long strings too."""
    import functools
    table = torch.zeros(1000)

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(10, 10)                                  # 110
            self.tied = self.lin.weight                                          # the same storage: 0
            self.register_buffer("buf", torch.zeros(7))                         # 7
            self.extra = {"a": [torch.zeros(20), torch.zeros(20)[:5]]}          # 20 + 20 (a view: its storage)
            self.fn = functools.partial(lambda x, t: x, t=torch.zeros(30))      # 30
            self.cb = (lambda: table)                                           # 1000, a closure
            self.numbers = [0.5] * (lesson16.FREE_NUMBERS + 40)                  # 40 beyond the free ones
            self.d_model = 64                                                   # a setting: 0

        def forward(self, x):
            return self.lin(x) + _GLOBAL_TABLE[:10]                              # 300, a global the code names

    assert lesson16.model_numbers(M()) == 110 + 7 + 20 + 20 + 30 + 1000 + 40 + 300


def test_cases_are_drawn_from_the_seed():
    ex = get("16_capstone")
    a, b = (ex.cases(torch.Generator().manual_seed(s)) for s in (0, 1))
    assert a[0].params["seed"] != b[0].params["seed"]
    assert not torch.equal(a[LOSS].inputs["probe"], b[LOSS].inputs["probe"])
    assert not torch.equal(a[KV].inputs["a"], b[KV].inputs["a"])
    x, probe = a[LOSS].inputs["x"], a[LOSS].inputs["probe"]
    half = x.shape[1] // 2
    assert torch.equal(x[:len(probe), :half], probe[:, :half]) and not torch.equal(x[:len(probe), half:], probe[:, half:])
    swap, seq = a[KV].inputs["swap"], a[KV].inputs["a"][0]
    assert (swap != seq).all() and ((32 <= swap) & (swap < 127)).all()            # another printable character


def test_the_loss_is_measured_on_the_whole_held_out_split_at_the_cache_length():
    """125 consecutive windows of 128 characters (the KV cache's length) cover the held-out text: every character
    but the last few is predicted exactly once, from the character before it."""
    val = TextData().val
    inputs = get("16_capstone").cases(torch.Generator().manual_seed(0))[LOSS].inputs
    x, y = inputs["x"], lesson16.heldout_windows()[1]
    assert set(inputs) == {"train", "x", "probe"}                             # the targets stay with the grader
    assert torch.equal(inputs["train"].long(), TextData().train)              # the child trains on the training split
    assert x.shape == (125, lesson16.KV_CONTEXT) == (len(val) // lesson16.KV_CONTEXT, 128)
    assert torch.equal(x.flatten(), val[:x.numel()]) and torch.equal(y.flatten(), val[1:x.numel() + 1])
    assert len(val) - 1 - x.numel() < lesson16.KV_CONTEXT
    logits = torch.randn(*x.shape, 128, generator=torch.Generator().manual_seed(1))
    loss, se = lesson16.loss_with_se(logits, y)
    per = torch.stack([F.cross_entropy(logits[i].double(), y[i]) for i in range(len(x))])   # per window
    assert math.isclose(loss, float(per.mean()), rel_tol=1e-12)
    assert math.isclose(se, float(per.std()) / math.sqrt(len(x)), rel_tol=1e-9)
    assert math.isclose(loss, lesson16.heldout_loss(logits, y), rel_tol=1e-12)


def test_one_seed_for_the_whole_class(monkeypatch):
    """The capstone ranks a class: its held-out cases do not depend on the learner's cell (editing a comment
    re-rolls nothing), while an exercise without a leaderboard still draws per cell. The seed is the instructor's
    (ATTN_COURSE_CLASS_SEED, else a secret drawn once per process), not derivable from the exercise id."""
    import hashlib
    ex = get("16_capstone")
    src = solution_source()
    edited = src.replace("# A GQA decoder", "# my comment, edited: a GQA decoder")
    assert edited != src and held_out_seed(edited) != held_out_seed(src)
    monkeypatch.delenv("ATTN_COURSE_CLASS_SEED", raising=False)
    assert exercise_seed(ex, src) == exercise_seed(ex, edited) == exercise_seed(ex, None)
    public = int(hashlib.sha256(("attn_course class seed\n" + ex.id).encode()).hexdigest()[:15], 16)
    assert exercise_seed(ex, None) not in (public, held_out_seed(None))        # the old derivation from the id
    monkeypatch.setenv("ATTN_COURSE_CLASS_SEED", "123456789")
    assert exercise_seed(ex, src) == exercise_seed(ex, edited) == 123456789
    a, b = held_out_cases(ex, exercise_seed(ex, src)), held_out_cases(ex, exercise_seed(ex, edited))
    assert [c.params for c in a] == [c.params for c in b]
    assert all(torch.equal(ca.inputs[k], cb.inputs[k]) for ca, cb in zip(a, b) for k in ca.inputs)
    from attn_course.grading.exercises import registry
    other = next(e for e in registry().values() if not e.rank_by)
    assert exercise_seed(other, src) != exercise_seed(other, edited) == held_out_seed(edited)


# ---- the course's design, the stub and the bar ----------------------------------------------------------

def test_solution_scores_full_marks_with_the_real_recipe(capsys):
    result = check("16_capstone", cell(solution_source()))
    out = capsys.readouterr().out
    assert result.passed and result.score == 4, out
    assert "108,928 numbers" in out and "512 bytes per token" in out
    assert "1.00× the forward's FLOPs per token; every token reaches the last" in out


def test_released_stub_scores_zero(capsys):
    nb = nbk.read(ROOT / "exercises" / f"{STEM}.ipynb")
    result = check("16_capstone", cell(nbk.source_of(nbk.exercise_cells(nb)["16_capstone"])))
    capsys.readouterr()
    assert result.status == "not attempted" and result.score == 0


def test_the_bar_separates_a_model_that_attends_from_one_that_does_not(capsys):
    """Independent baselines: the held-out loss of a counted bigram table is well above the bar; a learned
    model without attention (the learner cell) misses it; the course's design clears it with margin."""
    data = TextData()
    bi = torch.ones(128, 128, dtype=torch.float64)
    bi.index_put_((data.train[:-1], data.train[1:]), torch.ones(len(data.train) - 1, dtype=torch.float64),
                  accumulate=True)
    bigram = float(-(bi / bi.sum(1, keepdim=True))[data.val[:-1], data.val[1:]].log().mean())
    assert bigram > lesson16.BAR + 0.2
    res = results("16_capstone", cell(_BIGRAM), seed=5)
    assert [ok for ok, _ in res] == [True, True, False, False], res
    assert "is not below the bar" in res[LOSS][1] and "does not change the logits at the last" in res[KV][1]
    loss = float(res[LOSS][1].split("held-out loss ")[1].split()[0])
    assert lesson16.BAR < loss < bigram + 0.2


# ---- typical failures lose exactly the point the prompt says -------------------------------------------

def test_over_budget_loses_the_parameter_point_and_its_loss_does_not_count(short):
    res = results("16_capstone", cell(_gqa(D=96, HKV=1)))
    assert not res[PARAMS][0] and "218,592 numbers" in res[PARAMS][1] and "over the budget of 150,000" in res[PARAMS][1]
    assert res[DECODE][0] and res[KV][0]
    assert not res[LOSS][0] and "does not count" in res[LOSS][1]


@pytest.mark.parametrize("source, hint", [
    (_gqa(TOKENS="1"), "you report bytes per token"),
    (_gqa().replace("* 4 * n_tokens", "* n_tokens"), "you count elements, not bytes"),
    (_gqa().replace("N * 2 * HKV", "N * HKV"), "you count only the keys or only the values"),
    (_gqa(TOKENS="(n_tokens + 1)"), "but the cache your step returned holds"),
])
def test_a_wrong_kv_report_loses_the_decode_point_only(short, source, hint):
    res = results("16_capstone", cell(source))
    assert res[PARAMS][0] and res[KV][0], res
    assert not res[DECODE][0] and hint in res[DECODE][1], res


def test_mha_is_over_the_kv_budget(short):
    res = results("16_capstone", cell(_gqa(HKV=4)))
    assert res[PARAMS][0] and res[DECODE][0], res
    assert not res[KV][0] and "1024 bytes per token, over the budget of 512" in res[KV][1]


def test_a_step_without_positions_fails_decode_and_kv(short):
    res = results("16_capstone", cell(_gqa(POS="0")))
    assert res[PARAMS][0] and not res[DECODE][0] and not res[KV][0]
    assert "differ from model(codes)'s at token 1" in res[DECODE][1] and "true position" in res[KV][1]


def test_state_kept_in_the_model_is_caught_by_interleaved_decoding(short):
    """A step that stores the cache on the model (and returns a token-sized dummy) breaks when two sequences
    are decoded in turn, and so cannot under-report its cache."""
    src = _gqa().replace("return self.head(self.norm(x)), new", "self.saved = new\n            return self.head(self.norm(x)), None") \
                .replace("t = 0 if cache is None else cache[0][0].shape[2]",
                         "cache = getattr(self, 'saved', None)\n            t = 0 if cache is None else cache[0][0].shape[2]")
    res = results("16_capstone", cell(src))
    assert not res[DECODE][0] and "interleaved" in res[DECODE][1]


def test_a_model_that_sees_the_future_gets_no_loss_point(short):
    src = _gqa().replace("x = b(x)", "x = b(x, is_causal=False)")
    res = results("16_capstone", cell(src))
    assert not res[DECODE][0]
    assert not res[LOSS][0] and "looks at later characters" in res[LOSS][1]


def test_compute_budget(short, monkeypatch):
    monkeypatch.setattr(lesson16, "FLOP_BUDGET", 1e8)
    res = results("16_capstone", cell(_gqa()))
    assert not res[LOSS][0] and "GFLOP, over the budget of 0.1" in res[LOSS][1]


def test_not_a_module(short):
    res = results("16_capstone", lambda vocab: "a model")
    assert not any(ok for ok, _ in res) and "must return a torch.nn.Module" in res[PARAMS][1]


# ---- the review's shortcuts score below full marks (review 2026-11-26 08-14, H14-2, M14-1, Low) ------------

def _recomputes_the_whole_forward(res):
    """test_the_cache_rule_compares_a_step_with_the_forward_per_token's claim on a recomputing step: 128×."""
    assert "128.0× your forward's" in res[KV][1] and f"limit {lesson16.CACHE_RATIO:g}×" in res[KV][1], res


def _window_64_drops_context(res):
    """test_a_window_of_64_is_not_free's claim on the KV point: token 0 does not reach position 127."""
    assert not res[KV][0] and "changing token 0 (of 128)" in res[KV][1] and "1 of the 127" in res[KV][1], res


# what other tests assert on a shortcut's results, checked here on the same (deterministic) run: one results()
# per shortcut in the suite, not one per test that reads it
ALSO_ASSERTED = {"recompute, token codes": _recomputes_the_whole_forward,
                 "recompute over a fixed float buffer": _recomputes_the_whole_forward,
                 "MHA + window 64": _window_64_drops_context}


@pytest.mark.parametrize("name", list(SHORTCUTS))
def test_every_shortcut_of_the_review_scores_below_full_marks(short, name):
    """Each shortcut loses the point its rule names, with that rule's hint; the short recipe is enough, since the
    point it loses does not depend on training (the loss point is the real recipe's, see the end-to-end test)."""
    source, point, hint = SHORTCUTS[name]
    res = results("16_capstone", cell(source))
    i = {"parameters": PARAMS, "kv": KV}[point]
    assert not res[i][0] and hint in res[i][1], res
    assert res[DECODE][0], res                                   # each decodes correctly: it is not a broken model
    assert get("16_capstone").score(sum(ok for ok, _ in res), 4) < 4
    if name in ALSO_ASSERTED:
        ALSO_ASSERTED[name](res)


def test_the_cache_rule_compares_a_step_with_the_forward_per_token():
    """FLOPs (FlopCounterMode) of the step that adds token 128 over the forward's FLOPs per token on the same 128
    tokens: recomputing the prefix — growing (token codes) or in a fixed float buffer (H16-1) — does the whole
    forward in one step, 128× (asserted on those two shortcuts' results in
    test_every_shortcut_of_the_review_scores_below_full_marks, _recomputes_the_whole_forward); a real cache does
    per token what the forward does: the same projections, and attention over the cached keys, which is the
    forward's masked attention row at the last position (by hand below: 1.00× for the hand-written ALiBi + MQA
    attention; SDPA's fused kernel is counted in neither)."""
    model = cell(_ALIBI_MQA)(128).eval()
    seq = TextData().val[:128][None]
    _, _, caches, step = lesson16._decode(model, [seq], count_last=True)
    with torch.no_grad():
        _, forward = lesson16._flops(model, seq)
    # by hand: per token and layer, the projections q 2·d·d, k and v 2·d·2·16, o 2·d·d, the MLP 2·2·d·3d, and
    # attention 2·2·(4 heads·16)·L (scores and values; the causal mask still multiplies the whole row); the head 2·d·128
    d, L = 64, 128
    per_token = 2 * (2 * d * d + 2 * d * 32 + 2 * d * d + 2 * 2 * d * 3 * d + 2 * 2 * 64 * L) + 2 * d * 128
    assert forward == per_token * L and step == per_token, (forward, step, per_token)


def test_correct_caches_in_other_dtypes_score_full_marks(short, monkeypatch):
    """M16-2: lesson 14's int8 KV cache (scales counted: 160 B/token) and a float16 cache (256 B/token) pass every
    rule, through check() and the grading path alike (the bar is lowered: 5 training steps cannot reach it).
    check()'s sandboxed child trains the recipe of the process that drew the cases (the loss case carries its
    steps): 5 steps leave the loss far above the real recipe's ~2.2 nats/char."""
    monkeypatch.setattr(lesson16, "BAR", 10.0)
    for source, per in ((INT8_KV, 160), (FP16_KV, 256)):
        res = results("16_capstone", cell(source))
        assert all(ok for ok, _ in res) and f"{per} bytes per token" in res[KV][1], res
        r = check("16_capstone", cell(source))
        assert r.score == 4, r
        loss = float(re.search(r"held-out loss (\d+\.\d+)", r.cases[LOSS].message).group(1))
        assert loss > 3.5, r.cases[LOSS]           # the child trained 5 steps, not RECIPE's 300 of its own import


def test_a_window_of_64_is_not_free(short):
    """M14-1: MHA with a window of 64 and a 64-slot rolling cache holds 512 bytes per token at 128 tokens, but two
    windowed layers reach 2 · 63 = 126 tokens back: token 0 never reaches position 127, so its cache does not
    serve the 128-token context it is measured at (the KV point), and its forward at 128 differs from the same
    weights without the window (the loss, measured at 128, pays for the context it drops). The KV point of the
    window of 64 is asserted on its shortcut's results (test_every_shortcut_of_the_review_scores_below_full_marks,
    _window_64_drops_context); the window of 65 here."""
    torch.manual_seed(0)
    windowed = cell(WINDOW_64)(128).eval()
    full = cell(WINDOW_64)(128).eval()
    full.load_state_dict(windowed.state_dict())
    for b in full.blocks:
        b.window = None
    x = TextData().val[:128][None]
    with torch.no_grad():
        assert torch.allclose(windowed(x)[:, :64], full(x)[:, :64], atol=1e-5)      # within the window: the same
        assert not torch.allclose(windowed(x)[:, 64:], full(x)[:, 64:], atol=1e-3)  # beyond it: context is lost
    assert results("16_capstone", cell(WINDOW_64.replace("window=64", "window=65").replace("W = 64", "W = 65")
                                       .replace("min(n, 64)", "min(n, 65)")))[KV][1].startswith("after 128 tokens")


def test_the_time_limit_is_derived_from_the_solution_run(monkeypatch):
    """calibrate(): the capstone's limit is TIME_FACTOR × the CPU seconds of the course's solution's run (its
    children's rusage, not the wall time), never below --timeout; a lesson without time_factor keeps --timeout.
    cpu_limited(): the child's RLIMIT_CPU is that limit, the wall clock only a backstop WALL_SLACK × it."""
    course = runner.Course(ROOT)
    seen = []

    cpu = iter([100.0, 130.0] * 3)                     # the children's CPU seconds before and after: 30 s

    def fake(sub, course_, opts):
        seen.append(opts.timeout)
        return {"error": None, "total": 4.0, "max_score": 4.0, "exercises": {}, "_runs_seconds": [99.0]}
    monkeypatch.setattr(runner, "grade_submission", fake)
    monkeypatch.setattr(runner, "_children_cpu", lambda: next(cpu))
    opts = runner.Options(timeout=60)
    runner.calibrate(course, [STEM], opts)
    assert opts.lesson_timeout == {STEM: lesson16.TIME_FACTOR * 30.0} and seen == [runner.CALIBRATION_TIMEOUT]
    opts = runner.Options(timeout=500)
    runner.calibrate(course, [STEM], opts)
    assert opts.lesson_timeout == {STEM: 500}
    other = next(lesson for lesson in course.ids if lesson != STEM and course.ids[lesson])
    opts = runner.Options(timeout=60)
    runner.calibrate(course, [other], opts)
    assert opts.lesson_timeout == {} and seen[-1] == 60
    limited = runner.cpu_limited(runner.Options(timeout=60), 120.0)
    assert limited.cpu_limit == 120.0 and limited.timeout == runner.WALL_SLACK * 120.0


def test_check_warns_when_a_design_trains_slowly():
    case = get("16_capstone").cases(torch.Generator().manual_seed(0))[LOSS]
    x = case.inputs["x"]
    got = {"logits": torch.zeros(*x.shape, 128), "probe": torch.zeros(*case.inputs["probe"].shape, 128),
           "parameters": torch.tensor(1000), "flops": torch.tensor(1e8, dtype=torch.float64)}
    for seconds, warned in ((45.0, False), (51.0, True)):
        got |= {"seconds": torch.tensor(seconds, dtype=torch.float64), "yardstick": torch.tensor(20.0, dtype=torch.float64)}
        v = lesson16._judge(got, lesson16._expected(case), case)
        assert ("⚠ it trained in" in v.hint) == warned and (f"{seconds / 20:.1f}× a model" in v.hint) == warned
        assert ("CPU s" in v.hint) == warned


# ---- the leaderboard -------------------------------------------------------------------------------------

def _report(sid, loss, params=100_000, kv=512.0, flops=0.4, points=4.0, measured=True, noise=0.05):
    m = {"parameters": params, "parameters within budget": params <= lesson16.PARAM_BUDGET,
         "KV bytes/token": kv, "KV within budget": kv <= lesson16.KV_BUDGET, "held-out loss": loss,
         "± 2 s.e.": noise,
         "GFLOP per batch": flops, "compute within budget": flops <= lesson16.FLOP_BUDGET / 1e9}
    e = {"points": points, "max_points": 4.0, **({"measured": m} if measured else {})}
    return {"student_id": sid, "exercises": {"16_capstone": e}}


def test_leaderboard_rows_rank_within_budget_by_loss():
    reports = [_report("a", 2.0), _report("b", 1.7), _report("c", 1.5, params=200_000, points=3),
               _report("d", 1.6, kv=1024.0, points=3), _report("e", None, measured=False, points=0),
               _report("f", 1.7), {"student_id": "g", "exercises": {}}]
    rows = leaderboard_rows(reports, "16_capstone")
    assert [(r["student_id"], r["rank"]) for r in rows] == [("b", 1), ("f", 2), ("a", 3), ("c", None),
                                                           ("d", None), ("e", None)]
    assert [r["within budget"] for r in rows] == [True, True, True, False, False, False]
    # within noise: |Δ| ≤ hypot(0.05, 0.05) = 0.0707: b and f (0) tie; a is 0.3 behind both
    assert [r.get("within noise of") for r in rows] == ["", "#1", "", None, None, None]


def test_leaderboard_marks_designs_within_noise():
    reports = [_report("a", 2.00, noise=0.04), _report("b", 2.05, noise=0.04), _report("c", 2.06, noise=0.01),
               _report("d", 2.20, noise=0.04), _report("e", 2.21)]
    rows = leaderboard_rows(reports, "16_capstone")
    # b − a = 0.05 ≤ hypot(.04, .04) = .057: within noise of #1; c − a = 0.06 > hypot(.04, .01) = .041, but
    # c − b = 0.01: within noise of #2; d is 0.14 behind c and beyond every noise; e ties d
    assert [(r["student_id"], r["rank"], r["within noise of"]) for r in rows] == [
        ("a", 1, ""), ("b", 2, "#1"), ("c", 3, "#2"), ("d", 4, ""), ("e", 5, "#4")]


def test_the_tie_band_adds_the_seed_spread_and_pairs_the_windows():
    """tie_band: 2·sqrt(σ_a² + σ_b² + var of the mean per-window difference): two designs whose per-window losses
    differ by a constant have no sampling noise between them, only the seeds'; without the per-window values, the
    rows' ± 2 s.e. in quadrature; with σ = SEED_SD the band of two designs is 2·√2·σ at least."""
    ex = get("16_capstone")
    base = [2.0 + 0.3 * math.sin(i) for i in range(125)]
    a = {"held-out loss": 2.0, "± 2 s.e.": 0.05, "seed s.d.": 0.035, "per-window loss": base}
    b = {"held-out loss": 2.09, "± 2 s.e.": 0.05, "seed s.d.": 0.035, "per-window loss": [v + 0.09 for v in base]}
    assert math.isclose(runner.tie_band(a, b, ex), 2 * math.sqrt(2) * 0.035, rel_tol=1e-9)
    assert runner._within_noise(a, b, ex)                                    # 0.09 < 0.099
    c = dict(b, **{"held-out loss": 2.11, "per-window loss": [v + 0.11 for v in base]})
    assert not runner._within_noise(a, c, ex)
    noisy = [v + 0.09 + (0.2 if i % 2 else -0.2) for i, v in enumerate(base)]
    d = {"held-out loss": 2.09, "± 2 s.e.": 0.05, "seed s.d.": 0.035, "per-window loss": noisy}
    import statistics
    var = statistics.variance([x - y for x, y in zip(base, noisy)]) / 125
    assert math.isclose(runner.tie_band(a, d, ex), 2 * math.sqrt(2 * 0.035 ** 2 + var), rel_tol=1e-6)
    plain = [{k: v for k, v in r.items() if k != "per-window loss"} for r in (a, b)]
    assert math.isclose(runner.tie_band(*plain, ex), 2 * math.sqrt(2 * 0.035 ** 2 + 2 * 0.025 ** 2), rel_tol=1e-9)
    assert lesson16.SEED_SD > 0.01                                           # measured, stored with the release


def _notebook(source: str | None, path: Path):
    nb = nbformat.read(ROOT / "exercises" / f"{STEM}.ipynb", as_version=4)
    for c in nb.cells:
        if nbk.grade_id(c) == "16_capstone" and source is not None:
            c.source = source
    nbformat.write(nb, str(path))


def test_grade_ranks_a_class_end_to_end(tmp_path, monkeypatch):
    """The real CLI (the course's solutions graded first, then four learners in sandboxed children, the
    real recipe): grades.csv keeps its contract columns; leaderboard.csv ranks the designs within budget
    by held-out loss and lists the others unranked; the numbers agree with independent counts. The reports
    of the course's solution (the calibration) and of the released stub (bob) get the checks that
    tests/test_grading_notebooks.py::test_solutions_get_full_marks_and_stubs_zero makes for every other lesson."""
    made, grade = {}, runner.grade_submission

    def keep(sub, course, opts):
        made.setdefault((sub.student_id, sub.path.stem), []).append(report := grade(sub, course, opts))
        return report

    monkeypatch.setattr(runner, "grade_submission", keep)
    subs = tmp_path / "subs"
    subs.mkdir()
    shutil.copy(ROOT / "solutions" / f"{STEM}.ipynb", subs / "alice.ipynb")      # the course's design
    _notebook(None, subs / "bob.ipynb")                                          # the released stub
    _notebook(CELLS["16_capstone"][1], subs / "carol.ipynb")                     # MQA + ALiBi by hand
    _notebook(_gqa(HKV=4), subs / "dave.ipynb")                                  # MHA: over the KV budget
    _notebook(solution_source().replace("# A GQA decoder", "# my own words: a GQA decoder"), subs / "erin.ipynb")
    out = tmp_path / "out"
    assert cli(["grade", str(subs), "--out", str(out), "--jobs", "2", "--timeout", "400", "--quiet"]) == 0
    # the solution graded once (the calibration), full marks; each learner once; the stub: 0, "not attempted"
    assert sorted(made) == sorted([("course solutions", STEM)] + [(s, s) for s in ("alice", "bob", "carol", "dave",
                                                                                    "erin")])
    assert all(len(v) == 1 for v in made.values()), made.keys()
    (r,) = made["course solutions", STEM]
    assert r["error"] is None and r["lesson"] == STEM, r["error"]
    bad = {i: (e["notes"], e["cases"]) for i, e in r["exercises"].items() if e["points"] != e["max_points"]}
    assert not bad and r["total"] == r["max_score"] == 4, bad
    (r,) = made["bob", "bob"]
    assert r["error"] is None and r["lesson"] == STEM and r["total"] == 0, r["error"]
    assert all(e["status"] == "not attempted" for e in r["exercises"].values()), r["exercises"]
    with open(out / "grades.csv", newline="") as f:
        grades = list(csv.DictReader(f))
    assert list(grades[0]) == ["student_id", "16_capstone", "total", "max_score"]
    assert {g["student_id"]: g["16_capstone"] for g in grades} == {"alice": "4", "bob": "0", "carol": "4", "dave": "3",
                                                                  "erin": "4"}
    with open(out / "leaderboard.csv", newline="") as f:
        board = list(csv.DictReader(f))
    assert list(board[0]) == ["rank", "within noise of", "student_id", "parameters", "KV bytes/token", "held-out loss",
                              "± 2 s.e.", "seed s.d.", "GFLOP per batch", "within budget", "points"]
    by = {r["student_id"]: r for r in board}
    reports = {s: json.loads((out / f"{s}.json").read_text()) for s in by}
    measured = {s: reports[s]["exercises"]["16_capstone"]["measured"] for s in by}
    # one seed for the class: the same design with another comment is trained and measured identically
    assert measured["erin"]["held-out loss"] == measured["alice"]["held-out loss"]
    assert reports["erin"]["seeds"] == reports["alice"]["seeds"] == reports["carol"]["seeds"]
    assert all(0 < measured[s]["± 2 s.e."] < 0.2 for s in ("alice", "carol", "erin"))
    losses = {s: measured[s]["held-out loss"] for s in ("alice", "carol", "erin")}
    ranked = sorted(losses, key=lambda s: (losses[s], s))
    assert [r["student_id"] for r in board[:3]] == ranked and [r["rank"] for r in board[:3]] == ["1", "2", "3"]
    twin = board[[r["student_id"] for r in board].index("erin")]
    assert twin["rank"] == "1" or twin["within noise of"] != ""                # a tie is within noise
    assert {r["student_id"]: (r["rank"], r["within budget"]) for r in board[3:]} == {"bob": ("", "no"),
                                                                                    "dave": ("", "no")}
    assert all(float(by[s]["held-out loss"]) < lesson16.BAR for s in ("alice", "carol", "dave"))
    # independent counts: parameters by building the models here, KV bytes per token from the designs
    # the grader counts every number a model reaches (lesson16.reachable): its parameters and the few other numbers
    # it holds (a small constant tensor, settings past the free ones), never fewer than its parameters
    for s, src in (("alice", solution_source()), ("carol", CELLS["16_capstone"][1])):
        n_params = sum(p.numel() for p in cell(src)(128).parameters())
        assert 0 <= int(by[s]["parameters"]) - n_params < 100, (s, by[s]["parameters"], n_params)
    assert [float(by[s]["KV bytes/token"]) for s in ("alice", "carol", "dave")] == [2 * 2 * 2 * 16 * 4,
                                                                                  2 * 2 * 1 * 16 * 4,
                                                                                  2 * 2 * 4 * 16 * 4]
    md = (out / "leaderboard.md").read_text()
    assert md.startswith("# Leaderboard — 16_capstone") and f"| 1 |  | {ranked[0]} |" in md and "| — |  | bob |" in md
    assert "within noise of #k" in md and "the instructor's class seed" in md
    assert "held-out loss" in (out / "alice.feedback.md").read_text()
