"""attn_course.flash_triton without Triton (CPU-only torch, macOS, Windows): the module imports, the launch
configuration (kernel_config) is the same as with Triton, launching and --bench say what is missing."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = textwrap.dedent("""
    import json, sys, torch
    import attn_course.flash_triton as ft
    cfg = {k: {d: ft.kernel_config(k, d, torch.float16, capability=c) for d in (16, 40, 64, 100, 128)
               for c in (80,)} for k in ft.KERNELS}
    out = dict(triton=ft.triton is not None, cfg=json.dumps(cfg, sort_keys=True))
    q = torch.randn(1, 2, 16, 16)
    try:
        ft.flash_attention_triton(q, q, q)
        out["launch"] = "ran"
    except Exception as e:
        out["launch"] = f"{type(e).__name__}: {e}"
    print(json.dumps(out))
""")


def _run(code, no_triton, tmp_path, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRITON_")}
    path = [str(ROOT)]
    if no_triton:
        fake = tmp_path / "no_triton" / "triton"
        fake.mkdir(parents=True, exist_ok=True)
        (fake / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'triton'\", name='triton')\n")
        path.insert(0, str(fake.parent))
    env["PYTHONPATH"] = os.pathsep.join(path)
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "attn_course.flash_triton", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def test_imports_without_triton_and_config_matches(tmp_path):
    import json
    without = _run(PROBE, True, tmp_path)
    assert without.returncode == 0, without.stderr[-2000:]
    w = json.loads(without.stdout.strip().splitlines()[-1])
    assert w["triton"] is False
    assert w["launch"].startswith("ModuleNotFoundError") and "Triton" in w["launch"]
    cfg = json.loads(w["cfg"])
    assert [cfg["forward"][str(d)]["BLOCK_D"] for d in (16, 40, 64, 100, 128)] == [16, 64, 64, 128, 128]
    try:
        import triton  # noqa: F401
    except ModuleNotFoundError:
        return
    with_triton = _run(PROBE, False, tmp_path)          # the same configuration as with Triton's next_power_of_2
    assert with_triton.returncode == 0, with_triton.stderr[-2000:]
    assert json.loads(with_triton.stdout.strip().splitlines()[-1])["cfg"] == w["cfg"]


def test_bench_without_triton_or_cuda_says_so(tmp_path):
    r = _run(None, True, tmp_path, "--bench")
    assert r.returncode == 1 and "Triton is not installed" in r.stdout, (r.stdout, r.stderr[-2000:])
    import torch
    if torch.cuda.is_available():
        return
    r = _run(None, False, tmp_path, "--bench")
    assert r.returncode == 1 and ("no CUDA device" in r.stdout or "Triton is not installed" in r.stdout), r.stderr


def test_bench_defaults_to_the_spill_free_launch_configuration():
    """--bench defaults to 64 x 64 blocks: the recorded AOT compile of kernel_config's launch has no spill on
    sm_80/89/90, while the record says 128 x 64 is not the default for a reason (it is not what was compiled)."""
    import argparse
    import inspect
    from attn_course import flash_triton, triton_aot
    src = inspect.getsource(flash_triton._bench)
    assert '"--block-q", type=int, default=64' in src and '"--block-k", type=int, default=64' in src
    assert inspect.signature(flash_triton.flash_attention_triton).parameters["block_q"].default == 64
    info, records = triton_aot.load_recorded()
    assert {r["arch"] for r in records} == {80, 89, 90}
    assert all(r["fits"] and r["spill_stores"] == r["spill_loads"] == 0 for r in records)
    assert flash_triton.BENCH_REPS >= 20
