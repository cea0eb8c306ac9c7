"""IPython startup file: fail a notebook cell that feeds a module on `device` a tensor created without a device.

The GPU bug it catches without a GPU (lesson 07 had it): a module moved with ``.to(device)`` is called with a
tensor that a cell created by ``torch.randn(...)`` (or ``zeros``, ``tensor``, ``arange``...) without
``device=``. On a CPU both are on the CPU and nothing happens; on CUDA the call stops with "Expected all
tensors to be on the same device". Here:

* torch's factory functions are wrapped: a tensor created *by notebook cell code* (the caller's file is an
  IPython cell, not a library) without a ``device=`` argument gets a marker attribute;
  ``tensor.to(<a device>)`` / ``.cuda()`` remove it (the cell placed the tensor);
* ``nn.Module.to(<a device>)`` / ``.cuda()`` mark the module and its submodules as placed
  (``.cpu()`` unmarks them: a module deliberately kept on the CPU may take CPU tensors);
* calling a placed module with a marked tensor (positional, keyword, or inside a list/tuple) raises
  ``RuntimeError`` naming the module and the cell line that created the tensor.

Not caught: a tensor derived from a marked one (``torch.randn(...) * 2``), functions instead of modules,
modules built with ``device=`` in their constructor. `make test-notebooks` and `make test-portable` copy this
file into an IPYTHONDIR's startup folder, so every notebook nbval executes runs with the probe;
tests/test_device_probe.py checks that it catches the pattern and lets the correct ones through.
"""


def _attn_course_device_probe():
    import functools
    import linecache
    import os
    import sys

    import torch

    MARK, PLACED = "_attn_course_created_without_device", "_attn_course_placed_on_device"
    FACTORIES = ("randn", "rand", "randint", "randperm", "zeros", "ones", "empty", "full", "arange", "tensor",
                 "linspace", "logspace", "eye", "as_tensor")

    def cell_line(frame):
        """``"line"`` if ``frame`` runs notebook cell code (an ipykernel cell file or an <ipython-input>)."""
        name = frame.f_code.co_filename
        if name.startswith("<ipython-input-") or os.path.basename(os.path.dirname(name)).startswith("ipykernel_"):
            return linecache.getline(name, frame.f_lineno).strip() or f"{name}:{frame.f_lineno}"
        return None

    def wrap_factory(name):
        original = getattr(torch, name)

        @functools.wraps(original)
        def factory(*args, **kwargs):
            out = original(*args, **kwargs)
            if kwargs.get("device") is None and isinstance(out, torch.Tensor):
                line = cell_line(sys._getframe(1))
                if line is not None:
                    try:
                        setattr(out, MARK, line)
                    except (AttributeError, RuntimeError):
                        pass
            return out
        factory._attn_course_probe = True
        setattr(torch, name, factory)

    def names_device(args, kwargs):
        if "device" in kwargs or "other" in kwargs:
            return True
        return any(isinstance(a, (str, torch.device, torch.Tensor)) or (isinstance(a, int) and not isinstance(a, bool))
                   for a in args)

    tensor_to, tensor_cuda = torch.Tensor.to, torch.Tensor.cuda

    def to(self, *args, **kwargs):
        out = tensor_to(self, *args, **kwargs)
        if names_device(args, kwargs) and MARK in getattr(out, "__dict__", {}):
            delattr(out, MARK)
        return out

    def cuda(self, *args, **kwargs):
        out = tensor_cuda(self, *args, **kwargs)
        if MARK in getattr(out, "__dict__", {}):
            delattr(out, MARK)
        return out

    module_to, module_cuda, module_cpu = torch.nn.Module.to, torch.nn.Module.cuda, torch.nn.Module.cpu

    def place(module, placed):
        for m in module.modules():
            m.__dict__[PLACED] = placed
        return module

    def m_to(self, *args, **kwargs):
        out = module_to(self, *args, **kwargs)
        return place(out, True) if names_device(args, kwargs) else out

    def m_cuda(self, *args, **kwargs):
        return place(module_cuda(self, *args, **kwargs), True)

    def m_cpu(self):
        return place(module_cpu(self), False)

    module_call = torch.nn.Module.__call__

    def check(module, value):
        if isinstance(value, (list, tuple)):
            for v in value:
                check(module, v)
        elif isinstance(value, torch.Tensor) and value.dim() > 0 and MARK in value.__dict__:   # 0-d: fine on CUDA
            raise RuntimeError(
                f"device check: {type(module).__name__} was moved to `device` (.to(device)), but it was called "
                f"with a tensor a notebook cell created without `device=`: `{value.__dict__[MARK]}`. On a GPU this "
                f"call fails (\"Expected all tensors to be on the same device\"): create the tensor with "
                f"device=device, or move it with .to(device).")

    def call(self, *args, **kwargs):
        if self.__dict__.get(PLACED):
            for v in args:
                check(self, v)
            for v in kwargs.values():
                check(self, v)
        return module_call(self, *args, **kwargs)

    if getattr(torch.randn, "_attn_course_probe", False):
        return                                                    # installed already
    # `with torch.device("meta"):` recognises factories by identity in a set it builds once; build it from the
    # originals now, and add the wrappers, so a device context still places what a wrapper creates
    from torch.utils._device import _device_constructors
    constructors = _device_constructors()
    for name in FACTORIES:
        wrap_factory(name)
        if getattr(torch, name).__wrapped__ in constructors:
            constructors.add(getattr(torch, name))
    torch.Tensor.to, torch.Tensor.cuda = to, cuda
    torch.nn.Module.to, torch.nn.Module.cuda, torch.nn.Module.cpu = m_to, m_cuda, m_cpu
    torch.nn.Module.__call__ = call


_attn_course_device_probe()
del _attn_course_device_probe
