"""The sandboxed side of the grader: ``python -I -m attn_course.grading._child JOBDIR``.

Runs in a fresh interpreter started by :mod:`attn_course.grading.runner`, in an empty working directory,
with a scrubbed environment. It first lowers its own resource limits (before any learner code exists in
the process), then executes the program the grader rebuilt (``JOBDIR/program.json``): trusted cells from
``solutions/`` and the learner's exercise cells. At each ``check("<id>", obj)`` position it applies the
exercise's trusted ``answer`` function to the grader's inputs (``JOBDIR/inputs/<id>.safetensors``) and
writes the learner's answers as plain tensors (``JOBDIR/out/<id>.safetensors``) plus a small status
(``JOBDIR/out/<id>.json``). Nothing here is trusted by the grader beyond "these bytes are tensors": the
learner's code shares this process and may have tampered with anything in it.
"""
from __future__ import annotations

import builtins
import json
import os
import sys


def _limit(memory_mb: int, cpu_s: int, file_mb: int, nofile: int, nproc: int | None) -> None:
    try:
        import resource
    except ImportError:                                  # Windows: no POSIX limits (see docs/grading.md)
        return

    def setl(which, value):
        try:
            resource.setrlimit(which, (value, value))
        except (ValueError, OSError):
            pass

    setl(resource.RLIMIT_CORE, 0)
    setl(resource.RLIMIT_AS, memory_mb * 2**20)
    setl(resource.RLIMIT_CPU, cpu_s)
    setl(resource.RLIMIT_FSIZE, file_mb * 2**20)
    setl(resource.RLIMIT_NOFILE, nofile)
    if nproc is not None and hasattr(resource, "RLIMIT_NPROC"):
        setl(resource.RLIMIT_NPROC, nproc)


# Starting another program would let exercise code read what the audit hook below hides (``cat``).
_SPAWN_EVENTS = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.startfile",
                 "pty.spawn"}


def _hide(paths: list[str]) -> None:
    """Deny, for the rest of this process, opening any file or folder under ``paths`` (by inode, so links
    and other spellings of the path are caught) and starting other programs.

    ``paths`` are the course's ``solutions/`` (the trusted notebooks with every answer) and the grader's
    inputs. An audit hook cannot be removed once added; it raises ``PermissionError`` (an ``OSError``, which
    library code that probes for optional programs already tolerates). Native code (``ctypes``, or
    ``_posixsubprocess`` called directly) bypasses audit hooks: see docs/grading.md.
    """
    hidden: set[tuple[int, int]] = set()
    for top in paths:
        for folder, _dirs, files in os.walk(top):
            for name in [folder, *(os.path.join(folder, f) for f in files)]:
                try:
                    st = os.stat(name)
                except OSError:
                    continue
                hidden.add((st.st_dev, st.st_ino))

    def hook(event, args):
        if event == "open" and hidden:
            target = args[0]
            if target is None:
                return
            try:
                st = os.stat(target)
            except (OSError, TypeError, ValueError):
                return
            if (st.st_dev, st.st_ino) in hidden:
                raise PermissionError(f"the grader does not let exercise code read {target!r}")
        elif event in _SPAWN_EVENTS:
            raise PermissionError("the grader does not let exercise code start other programs")

    sys.addaudithook(hook)


def _write_atomic(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def main(jobdir: str) -> None:
    with open(os.path.join(jobdir, "program.json"), encoding="utf-8") as f:
        prog = json.load(f)
    _limit(**prog["limits"])
    out = os.path.join(jobdir, "out")
    log = open(os.path.join(out, "progress.log"), "a", buffering=1, encoding="utf-8")

    import torch
    from safetensors.torch import load_file, save

    from .exercises import get
    from .guard import RuntimeGuard
    from .selfcheck import describe_exception
    from .spec import Case

    def plain(key, value) -> torch.Tensor:
        """A detached, contiguous CPU ``torch.Tensor`` holding ``value``'s data (subclasses unwrapped)."""
        if not issubclass(type(value), torch.Tensor):
            raise TypeError(f"{key}: a {type(value).__name__}, not a torch.Tensor")
        with torch._C.DisableTorchFunctionSubclass():
            t = torch.Tensor.as_subclass(value, torch.Tensor)
            return t.detach().to("cpu").contiguous().clone()

    # every input is read now, before any learner code runs; then the inputs and solutions/ are hidden
    inputs_dir = os.path.join(jobdir, "inputs")
    all_inputs = {ex_id: load_file(os.path.join(inputs_dir, f"{ex_id}.safetensors")) for ex_id in prog["cases"]}
    _hide([inputs_dir, os.path.join(jobdir, "program.json"), *prog.get("hide", [])])

    torch.manual_seed(0)
    ns = {"__name__": "__main__", "__builtins__": builtins, "display": print}
    cell_errors: dict[str, str] = {}
    for n, step in enumerate(prog["steps"]):
        log.write(f"{n} {step['kind']} {step.get('exercise') or step.get('id') or ''}\n")
        if step["kind"] == "code":
            try:
                exec(compile(step["source"], step["label"], "exec"), ns)
            except BaseException as exc:                  # SystemExit too: the learner's exit is ignored
                if step.get("exercise"):
                    cell_errors[step["exercise"]] = describe_exception(exc)
                else:
                    log.write(f"   trusted cell failed: {describe_exception(exc)}\n")
            continue
        if step["kind"] != "capture":
            continue
        ex_id = step["id"]
        if ex_id not in prog["cases"]:
            continue
        ex = get(ex_id)
        status: dict = {"cell_error": cell_errors.get(ex_id), "cases": [], "violations": []}
        tensors: dict[str, torch.Tensor] = {}
        try:
            obj = eval(compile(step["expr"], f"<check {ex_id}>", "eval"), ns)
        except BaseException as exc:
            status["capture_error"] = describe_exception(exc)
            obj = None
        if obj is not None or "capture_error" not in status:
            inputs = all_inputs[ex_id]
            violations: set[str] = set()
            for i, c in enumerate(prog["cases"][ex_id]):
                prefix = f"{i}/"
                case = Case(c["name"], {k[len(prefix):]: v for k, v in inputs.items() if k.startswith(prefix)},
                            c["params"])
                guard = RuntimeGuard(ex.forbidden)
                try:
                    with guard:
                        got = ex.answer(obj, case)
                    mine = {f"{i}/{key}": plain(key, value) for key, value in got.items()}
                    tensors.update(mine)
                    entry = {"status": "ok"}
                except NotImplementedError:
                    entry = {"status": "not attempted"}
                except BaseException as exc:
                    entry = {"status": "error", "error": describe_exception(exc)}
                violations |= guard.violations
                status["cases"].append(entry)
            status["violations"] = sorted(violations)
        try:
            data = save(tensors)
        except Exception as exc:
            status["save_error"] = describe_exception(exc)
            data = save({})
        _write_atomic(os.path.join(out, f"{ex_id}.safetensors"), data)
        _write_atomic(os.path.join(out, f"{ex_id}.json"), json.dumps(status).encode())
    _write_atomic(os.path.join(out, "done"), b"done")
    log.close()
    sys.stdout.flush()
    os._exit(0)                                           # skip atexit hooks the learner may have added


if __name__ == "__main__":
    main(sys.argv[1])
