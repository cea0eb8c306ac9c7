"""The sandboxed side of grading: ``python -I .../attn_course/grading/_child.py JOBDIR`` (``attn-course grade``) or a
fork of the per-kernel zygote ``_child.py --serve`` (``check()``): both run :func:`main` on a job folder.

Runs as a script, so ``attn_course/__init__.py`` and ``attn_course/grading/__init__.py`` never run here: stub
packages stand in for them (the stub ``attn_course.grading.check`` records nothing). :func:`main` lowers its
resource limits, reads every input, loads each exercise's ``answer`` function — the Exercise stripped of its
cases, reference and judge, its lesson module pruned to what the answer calls — then :func:`.sandbox.lock`
(no other course module exists or can be imported from here on) and executes the program the grader rebuilt
(``JOBDIR/program.json``): trusted cells and the learner's cells. At each capture it applies the exercise's
``answer`` to the grader's inputs under :func:`.sandbox.learner_call` and writes the answers as plain tensors
(``JOBDIR/out/<id>.safetensors``) plus a small status (``JOBDIR/out/<id>.json``). Nothing here is trusted by the
grader beyond "these bytes are tensors".
"""
import builtins
import dataclasses
import functools
import gc
import importlib.machinery
import json
import os
import sys
import types

_GRADING = os.path.dirname(os.path.abspath(__file__))
_PKG = os.path.dirname(_GRADING)
RUNTIME = ("attn_course", "attn_course.grading", "attn_course.grading.spec",
           "attn_course.grading.budget", "attn_course.grading.sandbox")


def _stubs() -> None:
    """Stub packages: submodules import without running the real ``__init__`` files."""
    for name, path in (("attn_course", _PKG), ("attn_course.grading", _GRADING),
                       ("attn_course.grading.exercises", os.path.join(_GRADING, "exercises"))):
        if name not in sys.modules:
            m = types.ModuleType(name)
            m.__path__, m.__package__, m.__file__ = [path], name, os.path.join(path, "__init__.py")
            m.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)   # find_spec() sees it
            sys.modules[name] = m
    sys.modules["attn_course.grading"].check = lambda *args, **kwargs: None


def _limit(memory_mb: int, cpu_s: int, file_mb: int, nofile: int, nproc) -> None:
    try:
        import resource
    except ImportError:                                  # Windows: no POSIX limits (see docs/grading.md)
        return
    for which, value in ((resource.RLIMIT_CORE, 0), (resource.RLIMIT_AS, memory_mb * 2**20),
                         (resource.RLIMIT_CPU, cpu_s), (resource.RLIMIT_FSIZE, file_mb * 2**20),
                         (resource.RLIMIT_NOFILE, nofile), (getattr(resource, "RLIMIT_NPROC", None), nproc)):
        if which is not None and value is not None:
            try:
                resource.setrlimit(which, (value, value))
            except (ValueError, OSError):
                pass


def _code_names(code) -> set:
    names, todo = set(), [code]
    while todo:
        c = todo.pop()
        names |= set(c.co_names)
        todo += [k for k in c.co_consts if isinstance(k, types.CodeType)]
    return names


def _prune(roots) -> None:
    """Delete from every exercise-set module each global that the ``roots`` (answer functions) cannot reach:
    the references, judges and mistake models go, what the answer calls stays."""
    keep: dict[int, tuple[dict, set]] = {}
    seen, todo = set(), list(roots)
    while todo:
        obj = todo.pop()
        if id(obj) in seen or obj is None:
            continue
        seen.add(id(obj))
        if isinstance(obj, functools.partial):
            todo += [obj.func, *obj.args, *obj.keywords.values()]
            continue
        fn = getattr(obj, "__func__", obj)
        if isinstance(fn, types.FunctionType):
            g = fn.__globals__
            if str(g.get("__name__", "")).startswith("attn_course.grading.exercises."):
                names = keep.setdefault(id(g), (g, set()))[1]
                for n in _code_names(fn.__code__) & set(g):
                    names.add(n)
                    todo.append(g[n])
            todo += [c.cell_contents for c in fn.__closure__ or () if c.cell_contents is not None]
            todo += [*(fn.__defaults__ or ()), *(fn.__kwdefaults__ or {}).values()]
        elif isinstance(obj, type) and str(obj.__module__).startswith("attn_course.grading.exercises."):
            todo += list(vars(obj).values())
    for g, names in keep.values():
        for n in [n for n in g if not n.startswith("__") and n not in names]:
            del g[n]


def load_answers(ids) -> tuple[dict, tuple]:
    """``{id: Exercise}`` holding only what runs in the sandbox (``answer_fn``, plain fields),
    and the modules the exercise sets allow (``SANDBOX_ALLOW``), imported now."""
    import importlib
    out, allow = {}, set()
    for ex_id in ids:
        module = importlib.import_module(f"attn_course.grading.exercises.lesson{ex_id[:2]}")
        ex = next(e for e in module.EXERCISES if e.id == ex_id)
        drop = {f.name: None for f in dataclasses.fields(ex) if f.name.endswith("_fn")
                and f.name != "answer_fn"}
        out[ex_id] = dataclasses.replace(ex, **drop)
        allow |= set(getattr(module, "SANDBOX_ALLOW", ()))
    for name in [*RUNTIME[2:], *allow]:
        if name.startswith("attn_course"):
            importlib.import_module(name)
    _prune([f for ex in out.values() for f in (ex.answer_fn,)])
    return out, tuple(allow)


def main(jobdir: str) -> None:
    _stubs()
    with open(os.path.join(jobdir, "program.json"), encoding="utf-8") as f:
        prog = json.load(f)
    _limit(**prog["limits"])
    out = os.path.join(jobdir, "out")
    log = open(os.path.join(out, "progress.log"), "a", buffering=1, encoding="utf-8")

    import torch
    from safetensors.torch import load_file, save

    from attn_course.grading import sandbox
    from attn_course.grading.spec import Case

    def plain(key, value) -> torch.Tensor:
        """A detached, contiguous CPU ``torch.Tensor`` holding ``value``'s data (subclasses unwrapped)."""
        if not issubclass(type(value), torch.Tensor):
            raise TypeError(f"{key}: a {type(value).__name__}, not a torch.Tensor")
        with torch._C.DisableTorchFunctionSubclass():
            t = torch.Tensor.as_subclass(value, torch.Tensor)
            return t.detach().to("cpu").contiguous().clone()

    inputs_dir = os.path.join(jobdir, "inputs")
    all_inputs = {ex_id: load_file(os.path.join(inputs_dir, f"{ex_id}.safetensors")) for ex_id in prog["cases"]}
    exercises, allow = load_answers(prog["cases"])
    gc.collect()
    sandbox.lock(allow=set(RUNTIME) | set(allow), hide=[inputs_dir, os.path.join(jobdir, "program.json"),
                                                         *prog.get("hide", [])])
    describe = sandbox.describe_exception

    torch.manual_seed(0)
    ns = {"__name__": "__main__", "__builtins__": builtins, "display": print}
    cell_errors: dict[str, str] = {}
    cell_refused: dict[str, str] = {}
    for n, step in enumerate(prog["steps"]):
        log.write(f"{n} {step['kind']} {step.get('exercise') or step.get('id') or ''}\n")
        if step["kind"] == "code":
            try:
                exec(compile(step["source"], step["label"], "exec"), ns)
            except BaseException as exc:                  # SystemExit too: the learner's exit is ignored
                if step.get("exercise"):
                    cell_errors[step["exercise"]] = describe(exc)
                    if isinstance(exc, sandbox.SandboxError):     # refused while the cell ran (an import, a thread)
                        cell_refused[step["exercise"]] = exc.rule
                else:
                    log.write(f"   trusted cell failed: {describe(exc)}\n")
            continue
        ex_id = step["id"]
        if step["kind"] != "capture" or ex_id not in prog["cases"]:
            continue
        ex = exercises[ex_id]
        status: dict = {"cell_error": cell_errors.get(ex_id), "cell_refused": cell_refused.get(ex_id), "cases": []}
        tensors: dict[str, torch.Tensor] = {}
        try:
            obj = eval(compile(step["expr"], f"<check {ex_id}>", "eval"), ns)
        except BaseException as exc:
            status["capture_error"] = describe(exc)
            obj = None
        if obj is not None or "capture_error" not in status:
            inputs = all_inputs[ex_id]
            for i, c in enumerate(prog["cases"][ex_id]):
                prefix = f"{i}/"
                case = Case(c["name"], {k[len(prefix):]: v for k, v in inputs.items() if k.startswith(prefix)},
                            c["params"])
                try:
                    with sandbox.learner_call(ex.kind, ex.forbidden, allow):
                        got = ex.answer(obj, case)
                    tensors.update({f"{i}/{key}": plain(key, value) for key, value in got.items()})
                    entry = {"status": "ok"}
                except NotImplementedError:
                    entry = {"status": "not attempted"}
                except BaseException as exc:
                    entry = {"status": "error", "error": describe(exc)}
                    if isinstance(exc, sandbox.SandboxError):
                        entry["refused"] = exc.rule
                status["cases"].append(entry)
        try:
            data = save(tensors)
        except Exception as exc:
            status["save_error"] = describe(exc)
            data = save({})
        for name, blob in ((f"{ex_id}.safetensors", data), (f"{ex_id}.json", json.dumps(status).encode())):
            with open(os.path.join(out, name + ".tmp"), "wb") as f:
                f.write(blob)
            os.replace(os.path.join(out, name + ".tmp"), os.path.join(out, name))
    with open(os.path.join(out, "done"), "wb") as f:
        f.write(b"done")
    log.close()
    sys.stdout.flush()
    os._exit(0)                                           # skip atexit hooks the learner may have added


def serve() -> None:
    """The zygote ``check()`` keeps per kernel: imports torch once, then forks one fresh child per job.

    Protocol on stdin/stdout, one line each: ``JOBDIR`` in; ``pid N`` (the child, its own process group) and,
    when it has exited, ``done STATUS CPU_SECONDS`` out. The zygote runs no learner code and starts no thread, so a fork
    is a clean copy."""
    _stubs()
    import torch                                          # noqa: F401
    import safetensors.torch                              # noqa: F401

    from attn_course.grading import sandbox, spec         # noqa: F401
    with sandbox.learner_call("build"):                  # imports what the modes need, once
        torch.zeros(1) + 1
    torch.manual_seed(0)                                  # its first call imports and reads source lines
    safetensors.torch.load(safetensors.torch.save({"x": torch.zeros(2)}))
    gc.freeze()                        # a child's gc.collect() skips (and so does not copy) the zygote's objects
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    for line in sys.stdin:
        jobdir = line.strip()
        pid = os.fork()
        if pid == 0:
            try:
                os.setsid()
                fd = os.open(os.path.join(jobdir, "output.txt"), os.O_WRONLY | os.O_CREAT, 0o600)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
                os.chdir(os.path.join(jobdir, "work"))
                main(jobdir)
            finally:
                os._exit(1)
        sys.stdout.write(f"pid {pid}\n")
        sys.stdout.flush()
        _, status, usage = os.wait4(pid, 0)
        sys.stdout.write(f"done {status} {usage.ru_utime + usage.ru_stime:.3f}\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve() if sys.argv[1] == "--serve" else main(sys.argv[1])
