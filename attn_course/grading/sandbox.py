"""The sandbox learner code runs in: shortcuts are made impossible, not detected (DESIGN §4).

The grading child (:mod:`._child`) calls :func:`lock` before any learner code exists in the process — the same
child for ``check()`` and ``attn-course grade``. From then on: no course modules (only the harness runtime and
the exercise set's ``SANDBOX_ALLOW``; a meta-path finder and an audit hook refuse the rest, in every thread and
through every path), no threads or processes, no native code. :func:`learner_call` adds, while the learner's
object runs on one case: no fused attention kernels and the exercise's other forbidden ops (a
TorchDispatchMode), and in a build exercise, data stays in torch (a TorchFunctionMode: an integer tensor of at most
:data:`DATA_LIMIT` elements may leave, floating-point values only :data:`FLOAT_LIMIT` per case in all). Each
refusal raises :class:`SandboxError` (``rule: <name> — ...``).
The rules, why, and what an in-process sandbox cannot close: docs/grading.md, "The sandbox".
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import traceback

__all__ = ["SandboxError", "RULES", "FUSED", "DATA_LIMIT", "FLOAT_LIMIT", "lock", "learner_call", "describe_exception"]

RULES = {"course": "no course modules", "threads": "no threads or processes", "native": "no native code",
         "fused": "no fused attention kernels", "data": "data stays in torch", "op": "forbidden operation"}
FUSED = ("scaled_dot_product", "flash_attention", "efficient_attention", "cudnn_attention", "_fused_sdp",
         "multi_head_attention", "transformer_encoder_layer", "flex_attention")
FUSED_OK = "fused attention kernels"     # in an exercise set's SANDBOX_ALLOW: its exercises may call them (lesson 11)
DATA_LIMIT = 4096                        # elements an integer tensor may hand out of torch in a build exercise
FLOAT_LIMIT = 16                         # floating-point values that may leave torch during one case, in all
PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TORCH_DIR = None


class SandboxError(PermissionError):
    """A refused operation; ``str()`` starts with ``rule: <name>``."""

    def __init__(self, rule: str, what: str):
        super().__init__(f"rule: {RULES[rule]} — {what}")
        self.rule = RULES[rule]


def describe_exception(exc: BaseException) -> str:
    """One friendly line: ``TypeError: message (line 3, in attention)``, pointing at the learner's code."""
    global _TORCH_DIR
    if _TORCH_DIR is None:
        import torch
        _TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
    text = " ".join(str(exc).split())
    if len(text) > 240:
        text = text[:237] + "..."
    line = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    mine = [f for f in traceback.extract_tb(exc.__traceback__, limit=50)
            if not os.path.abspath(f.filename).startswith((PKG_DIR + os.sep, _TORCH_DIR + os.sep))
            and "site-packages" not in f.filename]
    if mine:
        line += f" (line {mine[-1].lineno}, in {mine[-1].name})"
    return line


class _State:
    locked = False
    allow: frozenset = frozenset()
    hidden: set = set()
    call = None                          # while the learner's object runs: (refuse_fused, ops, build)
    floats_out = 0                       # floating-point values that left torch during this case


_state = _State()
_PROC_EVENTS = {"os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "subprocess.Popen",
                "pty.spawn", "os.startfile"}
_NATIVE_EVENTS = {"ctypes.dlopen", "ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.string_at", "ctypes.wstring_at",
                  "ctypes.cdata", "ctypes.cdata/buffer"}
_RELOAD = {"_thread", "threading", "_posixsubprocess", "subprocess", "_ctypes", "ctypes"}   # re-imports: originals


def _course(name) -> bool:
    return isinstance(name, str) and (name == "attn_course" or name.startswith("attn_course."))


def _check_import(name) -> None:
    if _course(name) and name not in _state.allow:
        raise SandboxError("course", f"`{name}` cannot be imported here: learner code runs where the course's "
                                     f"own modules (its answers) do not exist")
    if name in _RELOAD:
        raise SandboxError("threads", f"re-importing `{name}` is refused")


class _Finder:
    """First on ``sys.meta_path``: refuses course modules before any other finder looks for them."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if _state.locked:
            _check_import(name)
        return None


def _audit(event, args):
    if not _state.locked:
        return
    if event == "import":
        _check_import(args[0])
    elif event == "open":
        path = args[0]
        if isinstance(path, int) or path is None:
            return
        try:
            real = os.path.realpath(os.fsdecode(path))
            st = os.stat(real) if _state.hidden else None
        except (OSError, TypeError, ValueError):
            return
        if real.startswith(PKG_DIR + os.sep) or real == PKG_DIR:
            raise SandboxError("course", f"reading the course's files ({os.path.basename(real)}) is refused")
        if st is not None and (st.st_dev, st.st_ino) in _state.hidden:
            raise SandboxError("course", f"reading {real!r} is refused")
    elif event in _PROC_EVENTS:
        raise SandboxError("threads", f"`{event}` is refused: learner code runs in one thread of one process")
    elif event in _NATIVE_EVENTS:
        raise SandboxError("native", f"`{event}` is refused")


def _no_attribute(name):
    if name.startswith("__"):
        raise AttributeError(name)
    raise SandboxError("course", f"`attn_course.{name}` does not exist here: learner code runs where the course's "
                                 f"own modules (its answers) do not exist")


def _allowed_name(name):
    """``attn_course.<name>`` for a public name of a module this exercise set allows (``from attn_course import
    TransformerBlock`` where ``attn_course.block`` is allowed); anything else is refused."""
    if not name.startswith("__"):
        for mod in sorted(_state.allow):
            m = sys.modules.get(mod)
            if m is not None and mod.count(".") == 1 and name in getattr(m, "__all__", ()):
                return getattr(m, name)
    return _no_attribute(name)


def _no_thread(*args, **kwargs):
    raise SandboxError("threads", "starting a thread is refused: learner code runs in one thread of one process")


def _hide(paths) -> set:
    hidden = set()
    for top in paths:
        for folder, _dirs, files in os.walk(top):
            for name in [folder, *(os.path.join(folder, f) for f in files)]:
                try:
                    st = os.stat(name)
                except OSError:
                    continue
                hidden.add((st.st_dev, st.st_ino))
    return hidden


def lock(allow=(), hide=()) -> None:
    """Install the sandbox for the rest of this process (it cannot be undone): purge every ``attn_course``
    module not in ``allow`` from ``sys.modules``, refuse course imports and reads, threads, processes and
    native code; prepare the dispatcher rules that :func:`learner_call` switches on. ``hide``: folders and files
    whose contents may not be opened (the grader's inputs, ``solutions/``)."""
    import _thread
    import linecache
    import subprocess                                    # noqa: F401  (loads _posixsubprocess, replaced below)

    import _posixsubprocess
    import torch
    _state.allow = frozenset(allow)
    _state.hidden = _hide(hide)
    for name in [m for m in sys.modules if _course(m) and m not in _state.allow]:
        del sys.modules[name]
    for name in [f for f in linecache.cache if str(f).startswith(PKG_DIR + os.sep)]:
        del linecache.cache[name]
    sys.meta_path.insert(0, _Finder)
    sys.modules["attn_course"].__path__ = []           # the stub package: no submodule can be found on disk
    sys.modules["attn_course"].__getattr__ = _allowed_name
    sys.modules["attn_course.grading"].__getattr__ = _no_attribute
    threading.Thread.start = _no_thread
    _thread.start_new_thread = _thread.start_new = threading._start_new_thread = _no_thread
    _posixsubprocess.fork_exec = _no_thread
    _install_tensor_exits(torch)
    _state.locked = True
    sys.addaudithook(_audit)


# ---- while the learner's object runs ---------------------------------------------------------------------

_EXITS = {"numpy", "__array__", "tolist", "storage", "untyped_storage", "_typed_storage", "data_ptr", "__dlpack__",
          "__iter__", "item", "__float__", "__int__", "__format__", "__repr__", "__str__"}


def _install_tensor_exits(torch) -> None:
    """``to_dlpack`` has no ``__torch_function__``: wrapped, as :class:`_mode`'s data rule does for the methods."""
    original = torch._C._to_dlpack

    def to_dlpack(t, *args, **kwargs):
        _data_rule("to_dlpack", t)
        return original(t, *args, **kwargs)
    import torch.utils.dlpack as dl
    dl.to_dlpack = torch._C._to_dlpack = to_dlpack


def _data_rule(name, t) -> None:
    """In a build exercise: a tensor of more than :data:`DATA_LIMIT` elements never leaves torch; floating-point
    values leave (as numbers, arrays, lists or text) at most :data:`FLOAT_LIMIT` per case, counted together —
    one block at a time, or one ``.item()`` at a time, adds up. Iterating stays in torch: only its size counts."""
    call = _state.call
    if call is None or not call[2] or not hasattr(t, "numel"):
        return
    n = t.numel()
    if n > DATA_LIMIT:
        raise SandboxError("data", f"`Tensor.{name}` of a tensor of {n} elements (more than "
                                   f"{DATA_LIMIT}): in a build exercise the data stays in torch")
    if name != "__iter__" and (t.is_floating_point() or t.is_complex()):
        _state.floats_out += n
        if _state.floats_out > FLOAT_LIMIT:
            raise SandboxError("data", f"`Tensor.{name}`: {_state.floats_out} floating-point values have left "
                                       f"torch on this case (at most {FLOAT_LIMIT}, printing included): in a "
                                       f"build exercise the data stays in torch — print shapes, or a few values")


_mode_cls = None


def _mode():
    """The dispatch mode class (built on first use: it needs torch's Python dispatcher)."""
    global _mode_cls
    if _mode_cls is None:
        from torch.utils._python_dispatch import TorchDispatchMode

        class Refuse(TorchDispatchMode):
            def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
                name = func.name().split("::")[-1].split(".")[0]
                fused, ops, _ = _state.call or (False, (), False)
                if fused and any(p in name for p in FUSED):
                    raise SandboxError("fused", f"`aten.{name}` is refused: write attention from its parts")
                if name.lstrip("_") in ops:
                    raise SandboxError("op", f"`aten.{name}` is refused in this exercise (its prompt says so)")
                return func(*args, **(kwargs or {}))
        from torch._ops import HigherOrderOperator
        from torch.overrides import TorchFunctionMode

        class KeepData(TorchFunctionMode):
            """The data rule, for every way a tensor method is reached (``torch._C.TensorBase.numpy(t)`` too), and
            ``F.multi_head_attention_forward`` (nn.MultiheadAttention), fused or not, where fused kernels are refused."""
            def __torch_function__(self, func, types_, args=(), kwargs=None):
                name = getattr(func, "__name__", "")
                if isinstance(func, HigherOrderOperator):         # flex_attention's operator, before its dispatch
                    name = func.name()
                    if (_state.call or (False,))[0] and any(p in name for p in FUSED):
                        raise SandboxError("fused", f"`{name}` is refused: write attention from its parts")
                    raise SandboxError("op", f"`{name}` is a higher-order operator: they do not run in the sandbox")
                if name == "multi_head_attention_forward" and (_state.call or (False,))[0]:
                    raise SandboxError("fused", "`nn.MultiheadAttention` is refused: write attention from its parts")
                if name in _EXITS and args:
                    _data_rule(name, args[0])
                return func(*args, **(kwargs or {}))
        _mode_cls = Refuse, KeepData
    return _mode_cls


def _escape_hatches(mode):
    """Python-visible ways around a dispatch mode, refused while it guards the learner's call: popping it (a mode
    the learner's code pushed may still pop itself), excluding its dispatch key, ``OpOverload.redispatch``."""
    import torch
    import torch._ops
    import torch.utils._python_dispatch as pd

    def guard_pop(original):
        def pop(*args, **kwargs):
            n = torch._C._len_torch_dispatch_stack()
            if n and torch._C._get_dispatch_stack_at(n - 1) is mode:
                _refuse_hatch()
            return original(*args, **kwargs)
        return pop
    spots = [(torch._C, "_ExcludeDispatchKeyGuard", _refuse_hatch), (torch._C, "_DisableTorchDispatch", _refuse_hatch),
             (torch._ops.OpOverload, "redispatch", _refuse_hatch), (torch._C, "_unset_dispatch_mode", _refuse_hatch),
             (torch._C, "DisableTorchFunction", _refuse_hatch), (torch._C, "_pop_torch_function_stack", _refuse_hatch),
             (torch._C, "_set_torch_function_mode", _refuse_hatch)]
    spots += [(torch._C, "_pop_torch_dispatch_stack", guard_pop(torch._C._pop_torch_dispatch_stack)),
              (pd, "_pop_mode", guard_pop(pd._pop_mode))]
    return [(obj, name, new) for obj, name, new in spots if hasattr(obj, name)]


def _refuse_hatch(*args, **kwargs):
    raise SandboxError("fused", "leaving the grader's dispatch mode is refused")


_AUTOGRAD = "autograd"                   # an exercise forbidding torch.autograd: backward()/grad() are refused


def _ops_of(forbidden) -> tuple[bool, frozenset]:
    """(refuses fused kernels, aten op names refused) for an exercise's ``forbidden`` names."""
    alias = {"softmin": "softmax", "Softmin": "softmax", "Softmax": "softmax", "LogSoftmax": "log_softmax"}
    fused, ops = False, set()
    for name in forbidden:
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("scaled_dot_product_attention", "MultiheadAttention", "multi_head_attention_forward"):
            fused = True
        elif not _course(name) and "." in name and leaf != "flex_attention":
            ops.add(alias.get(leaf, leaf))
    return fused, frozenset(ops)


@contextlib.contextmanager
def learner_call(kind: str, forbidden=(), allow=()):
    """The rules that hold while the learner's object runs on one case (see the module docstring)."""
    import torch
    fused, ops = _ops_of(forbidden)
    fused = fused or (kind == "build" and FUSED_OK not in allow)      # an exercise that forbids them always wins
    autograd = "torch.autograd" in forbidden
    _state.call = (fused, ops, kind == "build")
    _state.floats_out = 0
    patched = []
    refuse, keep_data = _mode()
    mode = refuse()
    with keep_data(), mode:
        try:
            for obj, name, new in _escape_hatches(mode):
                patched.append((obj, name, getattr(obj, name)))
                setattr(obj, name, new)
            if autograd:
                for obj, name in ((torch.autograd, "grad"), (torch.autograd, "backward"), (torch.Tensor, "backward")):
                    patched.append((obj, name, getattr(obj, name)))
                    setattr(obj, name, _refuse_autograd)
            yield
        finally:
            for obj, name, original in reversed(patched):
                setattr(obj, name, original)
            _state.call = None


def _refuse_autograd(*args, **kwargs):
    raise SandboxError("op", "torch.autograd is refused in this exercise: write the backward by hand")
