"""The ``attn-course`` command: ``release [--check]``, ``grade SUBMISSION... --out DIR``, ``bench ...``."""
from __future__ import annotations

import argparse
import importlib
import sys

__all__ = ["main"]


def _at_least(lo, kind=float):
    """An argparse type: a number >= lo (an instructor's typo is refused, not charged to the learners)."""
    def parse(text: str):
        try:
            x = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if x < lo:
            raise argparse.ArgumentTypeError(f"must be at least {lo:g}, got {text}")
        return x
    return parse


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="attn-course", description="Tools of the attention course.")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("release", help="build exercises/ from solutions/")
    r.add_argument("--check", action="store_true", help="only compare; exit 1 if exercises/ is stale")
    r.add_argument("--root", default=None, help="course checkout (default: found upwards from cwd)")

    g = sub.add_parser("grade", help="grade learners' exercise notebooks in a sandbox")
    g.add_argument("submissions", nargs="+", metavar="SUBMISSION",
                   help="notebooks, or folders (every file inside is a submission)")
    g.add_argument("--out", required=True, help="output folder: grades.csv, <student>.json, <student>.feedback.md")
    g.add_argument("--timeout", type=_at_least(1.0), default=60.0,
                   help="wall-clock seconds per sandboxed run (default 60; checked on the course's solutions first)")
    g.add_argument("--jobs", type=_at_least(1, int), default=1, help="submissions graded in parallel (default 1)")
    g.add_argument("--seed", type=int, default=None,
                   help="draw every submission's inputs from this seed (default: from the submission's content)")
    g.add_argument("--memory", type=_at_least(256, int), default=4096,
                   help="address-space limit of the sandbox in MiB (default 4096; checked on the course's solutions first)")
    g.add_argument("--root", default=None, help="course checkout holding solutions/ (default: found upwards from cwd)")
    g.add_argument("--quiet", action="store_true", help="no progress bar")

    sub.add_parser("ring", help="ring attention on P local processes (forwarded to attn_course.ring)",
                   add_help=False).add_argument("args", nargs=argparse.REMAINDER)
    b = sub.add_parser("bench", help="benchmarks: --suite attention (default, attn_course.bench), linear "
                       "(attn_course.bench_linear) or sparse (attn_course.bench_sparse)", add_help=False)
    b.add_argument("args", nargs=argparse.REMAINDER)
    return p


# ``attn-course bench --suite NAME ...``: which module's main() gets the remaining arguments
_BENCH_SUITES = {"attention": "attn_course.bench", "linear": "attn_course.bench_linear",
                 "sparse": "attn_course.bench_sparse"}


def _bench_suite(args: list[str]) -> tuple[list[str], str | None]:
    """Remove ``--suite NAME`` / ``--suite=NAME`` from ``args``; return the rest and the module (None: unknown)."""
    rest, suite, i = [], "attention", 0
    while i < len(args):
        if args[i] == "--suite" and i + 1 < len(args):
            suite, i = args[i + 1], i + 2
        elif args[i].startswith("--suite="):
            suite, i = args[i].split("=", 1)[1], i + 1
        else:
            rest.append(args[i])
            i += 1
    return rest, _BENCH_SUITES.get(suite)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:                      # forward everything, --help included
        rest, name = _bench_suite(argv[1:])
        if name is None:
            print(f"attn-course bench: --suite must be one of {', '.join(_BENCH_SUITES)}", file=sys.stderr)
            return 2
        try:
            bench = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            print(f"attn-course bench: the benchmark module {name} is not installed in this "
                  "version of the course.", file=sys.stderr)
            return 2
        return int(bench.main(rest) or 0)
    if argv[:1] == ["ring"]:
        from .. import ring
        return int(ring.main(argv[1:]) or 0)
    args = _parser().parse_args(argv)
    if args.command == "release":
        from .release import release
        return release(args.root, check=args.check)
    from .runner import grade_cli
    return grade_cli(args)


if __name__ == "__main__":
    sys.exit(main())
