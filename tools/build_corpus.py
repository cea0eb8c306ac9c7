"""Freeze the course's text corpus: the docstrings of CPython's standard library, once.

Run once (``python tools/build_corpus.py``) to write ``attn_course/data/stdlib_docs.txt.xz``; the package
ships that file, so every learner trains and evaluates on the same text whatever their Python version.
Source: the docstrings of the pure-Python and built-in modules of the CPython standard library (the Python
version that froze it is recorded in the file's first line), under the Python Software Foundation License
Version 2 (https://docs.python.org/3/license.html). Documents (one docstring each) are deduplicated, kept as
ASCII (other characters become '?'), shuffled with a fixed seed and split 95 / 5 into train and held-out text.
"""
from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import lzma
import pkgutil
import random
import sys
import sysconfig
import warnings
from pathlib import Path

SKIP = ("antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "test", "lib2to3", "ensurepip",
        "venv", "pydoc_data", "site-packages")
OUT = Path(__file__).resolve().parents[1] / "attn_course" / "data" / "stdlib_docs.txt.xz"
SEP = "\n\n"


def module_names() -> list[str]:
    std = sysconfig.get_paths()["stdlib"]
    names = [m.name for m in pkgutil.walk_packages([std], onerror=lambda n: None)
             if m.name.split(".")[0] not in SKIP and "test" not in m.name.split(".")
             and not any(p.startswith("_") for p in m.name.split("."))]
    return sorted(set(names)) + sorted(n for n in sys.builtin_module_names if not n.startswith("_"))


def docs(module) -> list[str]:
    out = [inspect.getdoc(module)]
    for name in sorted(vars(module)):
        obj = vars(module)[name]
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isroutine(obj):
            out.append(inspect.getdoc(obj))
        elif inspect.isclass(obj):
            out.append(inspect.getdoc(obj))
            for meth in sorted(vars(obj)):
                f = vars(obj)[meth]
                if not meth.startswith("_") and inspect.isroutine(f):
                    out.append(inspect.getdoc(f))
    return [d for d in out if d and len(d) >= 40]


def clean(d: str) -> str:
    d = d.encode("ascii", errors="replace").decode("ascii")
    return "".join(c if (c >= " " or c == "\n") and c != "\x7f" else " " for c in d.replace("\t", "    ")).strip()


def main() -> None:
    seen, parts = set(), []
    for m in module_names():
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                    contextlib.redirect_stderr(io.StringIO()):
                warnings.simplefilter("ignore")
                mod = importlib.import_module(m)
            for d in docs(mod):
                d = clean(d)
                if d not in seen:
                    seen.add(d)
                    parts.append(d)
        except BaseException:          # a module that cannot be imported here (a missing C library): skipped
            pass
    random.Random(0).shuffle(parts)
    n_held = len(parts) // 20
    held, train = parts[:n_held], parts[n_held:]
    header = f"# CPython {sys.version.split()[0]} standard-library docstrings (PSF License 2.0); " \
             f"{len(train)} train + {len(held)} held-out documents\n"
    body = header + "\x1e".join((SEP.join(train), SEP.join(held)))          # RS separates the two splits
    OUT.write_bytes(lzma.compress(body.encode("ascii"), preset=9 | lzma.PRESET_EXTREME))
    print(f"{OUT}: {len(body):,} characters -> {OUT.stat().st_size:,} bytes; "
          f"train {sum(map(len, train)):,}, held-out {sum(map(len, held)):,}")


if __name__ == "__main__":
    main()
