"""Work counters that run inside the sandbox with the learner's code (the sandbox itself, which refuses course
modules, threads and fused kernels, is :mod:`.sandbox`): the largest tensor created and the work of products."""
from __future__ import annotations

import weakref

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["TensorWatch", "TensorCallWatch", "Work", "MatmulWork"]

# ---- tiling: the largest tensor the learner's code creates -------------------------------------------

def _distinct(t) -> int:
    """Elements a tensor really holds: an ``expand``ed (stride-0) axis holds its elements once."""
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            n *= size
    return n


class _LargestTensor:
    """Records the largest tensor (elements, bytes, shape) among the results it is shown."""

    def _reset(self):
        self.largest_numel = 0
        self.largest_bytes = 0
        self.largest_shape: tuple[int, ...] = ()

    _views_once = False       # count an expanded (stride-0) axis once: a view allocates nothing

    def _record(self, out):
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor):
                n = _distinct(t) if self._views_once else t.numel()
                if n > self.largest_numel:
                    self.largest_numel, self.largest_shape = n, tuple(t.shape)
                self.largest_bytes = max(self.largest_bytes, n * t.element_size())


class TensorWatch(_LargestTensor, TorchDispatchMode):
    """The largest tensor any ATen op creates while it is active — autograd's backward included.

    Deterministic, unlike memory counters: it counts what the code asks for. This is the counter behind
    :func:`attn_course.bench.largest_tensor_created`. (Its first use in a process imports
    ``torch._dynamo``, a few seconds: the tiling guard uses :class:`TensorCallWatch` instead.)"""

    def __init__(self):
        super().__init__()
        self._reset()

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self._record(out)
        return out


class TensorCallWatch(_LargestTensor, TorchFunctionMode):
    """The same counter one level up: the largest tensor returned by any torch function, tensor method or
    operator called while it is active (factories such as ``torch.empty`` included). It sees every tensor
    the learner's code holds, at no import cost; it does not see a composite op's internal temporaries
    or a backward pass. Used by exercises that promise tiling (``Exercise.max_numel_fn``); it lives here,
    in the grading package, so the runtime guard lets it run inside learner code.

    A view that repeats an axis without copying it (``expand``, stride 0) counts the elements it really holds:
    ``c_kv[:, None].expand(B, H, S, d_c)`` is B·S·d_c, not B·H·S·d_c (it allocates nothing; what is computed from
    it is a new tensor, counted in full)."""

    _views_once = True

    def __init__(self):
        super().__init__()
        self._reset()

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self._record(out)
        return out


# ---- the work of products (tiles visited): matrix products and elementwise multiply-and-reduce -------------

class Work(TorchDispatchMode):
    """Counts the work of the products run while it is active, however they are written:

    * ``flops``: 2 per multiply-add — of every matrix product (``mm``/``bmm``/``addmm``/``baddbmm``/``mv``/``dot``,
      where ``@``, ``matmul``, ``einsum`` and ``F.linear`` end up), **and** of every reduction (``sum``, ``mean``,
      ``cumsum``, ``prod``) of the result of an elementwise product (``mul``/``div``/``prod``, or a view of it):
      2 per element reduced, a multiply and an add. So ``(q[..., :, None, :] * k[..., None, :, :]).sum(-1)`` counts
      exactly what ``q @ k.transpose(-2, -1)`` counts, and an elementwise scaling that is not reduced
      (``alpha * acc``, ``s / math.sqrt(d)``) counts nothing;
    * ``calls``: the matrix products and counted reductions;
    * ``largest`` / ``largest_shape``: the largest result of such a product (a matrix product's result, or a
      counted reduction's), i.e. the largest block of scores the code formed at once.

    A tiling exercise compares ``flops`` with what the tiles it allows need (09_window_tiles: the band's tiles;
    10_chunked_scan: O(L·C); 13_ring_loop: the causal skip) and ``largest`` with one tile. Best effort, like
    :class:`TensorCallWatch`: a product spelled with additions (``exp(log a + log b)``) is not seen. It lives here
    so the runtime guard lets it run inside learner code; its first use in a process imports ``torch._dynamo``
    (a few seconds)."""

    _SIZES = {"mm": lambda a, b: a.shape[0] * a.shape[1] * b.shape[1],
              "bmm": lambda a, b: a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2],
              "mv": lambda a, b: a.shape[0] * a.shape[1],
              "dot": lambda a, b: a.shape[0], "vdot": lambda a, b: a.shape[0]}
    _BIASED = {"addmm": "mm", "baddbmm": "bmm", "addmv": "mv", "addmm_": "mm", "baddbmm_": "bmm", "addmv_": "mv"}
    _PRODUCTS = {"mul", "mul_", "div", "div_", "prod", "cumprod", "addcmul"}     # their results are products
    _REDUCTIONS = {"sum", "mean", "nansum", "cumsum", "prod", "cumprod"}          # count when they reduce one

    def __init__(self):
        super().__init__()
        self.calls = 0
        self.flops = 0
        self.largest = 0
        self.largest_shape: tuple[int, ...] = ()
        self._products: dict[int, weakref.ref] = {}

    def _is_product(self, t) -> bool:
        for x in (t, getattr(t, "_base", None)):
            ref = self._products.get(id(x)) if isinstance(x, torch.Tensor) else None
            if ref is not None and ref() is x:
                return True
        return False

    def _result(self, out):
        if isinstance(out, torch.Tensor) and out.numel() > self.largest:
            self.largest, self.largest_shape = out.numel(), tuple(out.shape)

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        reduced = name in self._REDUCTIONS and args and isinstance(args[0], torch.Tensor) \
            and self._is_product(args[0])
        out = func(*args, **(kwargs or {}))
        if name in self._BIASED:                               # bias + a @ b
            name, operands = self._BIASED[name], args[1:3]
        else:
            operands = args[:2]
        size = self._SIZES.get(name)
        if size is not None:
            self.calls += 1
            self.flops += 2 * size(*operands)
            self._result(out)
        elif reduced:                                          # Σ of a product: a multiply and an add per element
            self.calls += 1
            self.flops += 2 * args[0].numel()
            self._result(out)
        if name in self._PRODUCTS and isinstance(out, torch.Tensor):
            key = id(out)
            self._products[key] = weakref.ref(out, lambda _, key=key: self._products.pop(key, None))
        return out


MatmulWork = Work
"""The work counter's first name (it counted matrix products only); kept for old imports."""
