"""Lesson 08's Triton kernels compiled ahead of time for A100 (sm_80), L4 (sm_89) and H100 (sm_90), no GPU.

Every kernel (forward, dK/dV, dQ) × 3 GPUs × fp16/bf16 × head dim 64/128 × causal/non-causal is compiled for
real (fresh processes without TRITON_INTERPRET, an empty TRITON_CACHE_DIR each), at the launch parameters of
``flash_attention_triton``. The checks read the cubins themselves with ``cuobjdump`` (bundled with triton),
not only what the compile reported, and the shared-memory limits are the CUDA programming guide's
per-block maxima, written here independently of ``attn_course.triton_aot``.
"""
import inspect
import os
import subprocess
import warnings
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

import triton  # noqa: E402

from attn_course import flash_triton as ft  # noqa: E402
from attn_course import triton_aot as aot  # noqa: E402

# CUDA C++ Programming Guide, "Technical Specifications per Compute Capability": maximum shared memory
# per thread block — 163 KB (8.0, A100), 99 KB (8.9, L4), 227 KB (9.0, H100).
SMEM_PER_BLOCK = {80: 163 * 1024, 89: 99 * 1024, 90: 227 * 1024}
CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
KERNEL_NAMES = {"forward": "_flash_fwd_kernel", "backward_dkdv": "_flash_bwd_dkdv_kernel",
                "backward_dq": "_flash_bwd_dq_kernel"}


def test_full_matrix_compiles_fits_and_does_not_spill(tmp_path):
    """The whole matrix, compiled once (one test, so that pytest-xdist cannot compile it twice); each check
    below is a function of its own, run in turn on the 72 records."""
    configs = aot.matrix()
    records = aot.compile_configs(configs, jobs=2, cubin_dir=str(tmp_path), timeout=900)
    _covers_every_kernel_gpu_dtype_and_head_dim(configs, records)
    _compiled_at_the_launchers_parameters(records)
    _shared_memory_fits_every_gpu(records)
    _no_register_spills(records)
    _cubins_are_elf_for_the_target_with_the_reported_registers(records)
    _recorded_table_matches_a_fresh_compile(records)


def _covers_every_kernel_gpu_dtype_and_head_dim(configs, records):
    assert len(configs) == len(set(configs)) == 3 * 3 * 2 * 2 * 2
    assert {(r["kernel"], r["arch"], r["dtype"], r["head_dim"], r["causal"]) for r in records} == {
        (k, a, d, e, c) for k in KERNEL_NAMES for a in (80, 89, 90) for d in ("float16", "bfloat16")
        for e in (64, 128) for c in (False, True)}
    for r in records:
        assert r["name"] == KERNEL_NAMES[r["kernel"]]


def _compiled_at_the_launchers_parameters(records):
    """What was compiled is what flash_attention_triton launches on that GPU, at its default block sizes."""
    params = inspect.signature(ft.flash_attention_triton).parameters
    DEFAULT_BLOCKS = (params["block_q"].default, params["block_k"].default)
    for r in records:
        cfg = ft.kernel_config(r["kernel"], r["head_dim"], getattr(torch, r["dtype"]), capability=r["arch"])
        assert (r["block_m"], r["block_n"], r["block_d"], r["num_warps"], r["num_stages"]) == (
            cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_D"], cfg["num_warps"], cfg["num_stages"]), r
        assert (r["block_m"], r["block_n"]) == DEFAULT_BLOCKS and r["block_d"] == r["head_dim"]


def _shared_memory_fits_every_gpu(records):
    for r in records:
        assert 0 < r["shared_bytes"] <= SMEM_PER_BLOCK[r["arch"]], r
        assert r["smem_limit"] == SMEM_PER_BLOCK[r["arch"]] and r["fits"] is True


def _no_register_spills(records):
    for r in records:
        assert (r["spill_stores"], r["spill_loads"]) == (0, 0), r
        assert 0 < r["registers"] <= 255, r


def _cubins_are_elf_for_the_target_with_the_reported_registers(records):
    """Read each cubin back: ELF magic, SASS for the right sm_XX, and cuobjdump's register count and local
    memory (where spills go) agree with what ptxas reported during the compile."""
    for r in records:
        data = Path(r["cubin_path"]).read_bytes()
        assert data[:4] == b"\x7fELF" and len(data) == r["cubin_bytes"] > 10_000, r
        usage = subprocess.run([str(CUOBJDUMP), "--dump-resource-usage", r["cubin_path"]],
                               capture_output=True, text=True, check=True).stdout
        line = next(ln for ln in usage.splitlines() if "REG:" in ln)
        fields = dict(f.split(":", 1) for f in line.split() if ":" in f)
        assert int(fields["REG"]) == r["registers"] and int(fields["LOCAL"]) == 0, (r, line)
    # the architecture, on one cubin per GPU (disassembly is slower than the resource dump)
    for arch in (80, 89, 90):
        r = next(r for r in records if r["arch"] == arch)
        sass = subprocess.run([str(CUOBJDUMP), "-sass", r["cubin_path"]], capture_output=True, text=True,
                              check=True).stdout
        assert f"code for sm_{arch}" in sass and f"Function : {r['name']}" in sass


def _recorded_table_matches_a_fresh_compile(records):
    """The JSON lesson 08 prints was recorded with this triton and these launch parameters."""
    info, recorded = aot.load_recorded()
    if info["triton"] != triton.__version__:
        # The CPU build of torch pins no Triton, so a new Triton release can arrive with a fresh install.
        # The table names the Triton that made it; another one may allocate registers differently, and
        # every property that matters (compiles, fits, no spills, cubin) was asserted above for this one.
        warnings.warn(f"lesson 08's AOT table was recorded with triton {info['triton']}, this is "
                      f"{triton.__version__}: re-record with `python -m attn_course.triton_aot`")
        return
    key = lambda r: (r["kernel"], r["arch"], r["dtype"], r["head_dim"], r["causal"])  # noqa: E731
    fresh = {key(r): r for r in records}
    assert {key(r) for r in recorded} == set(fresh)
    for r in recorded:
        f = fresh[key(r)]
        for field in ("registers", "spill_stores", "spill_loads", "shared_bytes", "num_warps", "num_stages",
                      "block_m", "block_n", "block_d"):
            assert r[field] == f[field], (key(r), field, r[field], f[field])


def test_launchers_take_their_parameters_from_kernel_config(monkeypatch):
    """flash_attention_triton (forward and backward) asks kernel_config for all three kernels — the function
    the compiled table is built from — and passes what it returns (a spy under the interpreter)."""
    assert ft.interpreted(), "conftest sets TRITON_INTERPRET=1 before triton is imported"
    calls = []
    real = ft.kernel_config

    def spy(kernel, head_dim, dtype, **kw):
        calls.append((kernel, head_dim, dtype, kw))
        return real(kernel, head_dim, dtype, **kw)

    monkeypatch.setattr(ft, "kernel_config", spy)
    q, k, v = (torch.randn(1, 1, 20, 16, requires_grad=True) for _ in range(3))
    ft.flash_attention_triton(q, k, v, block_q=16, block_k=32).sum().backward()
    assert [c[0] for c in calls] == ["forward", "backward_dkdv", "backward_dq"]
    assert all(c[1] == 16 and c[2] == torch.float32 and c[3]["block_q"] == 16 and c[3]["block_k"] == 32
               and c[3]["capability"] is None for c in calls)


def test_kernel_config_rejects_unknown_kernels():
    with pytest.raises(ValueError, match="kernel must be one of"):
        ft.kernel_config("backward", 64, torch.float16)


def test_compiling_in_an_interpreted_process_is_refused():
    assert ft.interpreted(), "conftest sets TRITON_INTERPRET=1 before triton is imported"
    with pytest.raises(RuntimeError, match="interpreted"):
        aot._compile_here(aot.Config("forward", 80, "float16", 64, False))
    assert os.environ["TRITON_INTERPRET"] == "1"      # the subprocess route leaves this process untouched
