"""The grading half of the ``attn-course`` command: ``release [--check]`` and ``grade SUBMISSION... --out DIR``.

The console script is :mod:`attn_course.cli`, which adds ``ring`` and ``bench``; ``python -m
attn_course.grading.cli`` runs the two grading commands alone (grading imports neither the ring nor the
benchmarks)."""
from __future__ import annotations

import argparse
import sys

__all__ = ["main", "add_commands", "run"]


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


def add_commands(sub) -> None:
    """Add ``release`` and ``grade`` to an ``add_subparsers()`` object (the ``attn-course`` parser's)."""
    r = sub.add_parser("release", help="build exercises/ from solutions/")
    r.add_argument("--check", action="store_true", help="only compare; exit 1 if exercises/ is stale")
    r.add_argument("--root", default=None, help="course checkout (default: found upwards from cwd)")
    r.add_argument("--check-published", action="store_true",
                   help="ask the internet whether the repository, the release tag, lesson 01 at the tag (Colab) and "
                        "the website answer; exit 0 ok, 1 missing although published, 3 unreachable (docs/publishing.md)")

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



def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="attn-course", description="Grading tools of the attention course "
                                "(the full command: attn_course.cli).")
    add_commands(p.add_subparsers(dest="command", required=True))
    return p


def run(args: argparse.Namespace) -> int:
    """Run a parsed ``release`` or ``grade`` command."""
    if args.command == "release":
        if args.check_published:
            from .publish import check_published
            return check_published()
        from .release import release
        return release(args.root, check=args.check)
    from .runner import grade_cli
    return grade_cli(args)


def main(argv: list[str] | None = None) -> int:
    return run(_parser().parse_args(list(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    sys.exit(main())
