"""The ``attn-course`` command: ``release [--check]``, ``grade SUBMISSION... --out DIR``, ``bench ...``,
``ring ...``, ``train-lm --variant ...``."""
from __future__ import annotations

import argparse
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

    sub.add_parser("ring", help="ring attention on P local processes (forwarded to attn_course.ring)",
                   add_help=False).add_argument("args", nargs=argparse.REMAINDER)
    b = sub.add_parser("bench", help="benchmarks: --suite attention (default), sparse, linear or all "
                       "(attn_course.bench; `attn-course bench --help`)", add_help=False)
    b.add_argument("args", nargs=argparse.REMAINDER)
    sub.add_parser("train-lm", help="retrain a pretrained course LM: --variant plain|gated|sink [--out DIR] [--steps N] "
                   "(attn_course.pretrained)", add_help=False).add_argument("args", nargs=argparse.REMAINDER)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:                      # forward everything, --suite and --help included
        from ..bench import main as bench_main
        return int(bench_main(argv[1:]) or 0)
    if argv[:1] == ["train-lm"]:
        from .. import pretrained
        return int(pretrained.main(argv[1:]) or 0)
    if argv[:1] == ["ring"]:
        from .. import ring
        return int(ring.main(argv[1:]) or 0)
    args = _parser().parse_args(argv)
    if args.command == "release":
        if args.check_published:
            from .publish import check_published
            return check_published()
        from .release import release
        return release(args.root, check=args.check)
    from .runner import grade_cli
    return grade_cli(args)


if __name__ == "__main__":
    sys.exit(main())
