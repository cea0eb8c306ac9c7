"""The ``attn-course`` command (the console script): one entry point for the course's tools.

* ``release [--check]`` and ``grade SUBMISSION... --out DIR`` — :mod:`attn_course.grading.cli`;
* ``ring --world-size P --seq-len L ...`` — ring attention on P local processes (:mod:`attn_course.ring`);
* ``bench [--suite attention|sparse|linear|flash|notebooks|all] ...`` — the benchmarks (:mod:`attn_course.bench`);
* ``train-lm --variant plain|gated|sink [--out DIR] [--steps N]`` — retrain a pretrained course LM
  (:mod:`attn_course.pretrained`).

``ring``, ``bench`` and ``train-lm`` receive every argument after their name (``--help`` included), so each keeps its own parser.
"""
from __future__ import annotations

import argparse
import sys

from .grading import cli as grading_cli

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="attn-course", description="Tools of the attention course.")
    sub = p.add_subparsers(dest="command", required=True)
    grading_cli.add_commands(sub)
    sub.add_parser("ring", help="ring attention on P local processes (`attn-course ring --help`)",
                   add_help=False).add_argument("args", nargs=argparse.REMAINDER)
    sub.add_parser("bench", help="benchmarks: --suite attention (default), sparse, linear, flash, notebooks or all "
                   "(`attn-course bench --help`)", add_help=False).add_argument("args", nargs=argparse.REMAINDER)
    sub.add_parser("train-lm", help="retrain a pretrained course LM: --variant plain|gated|sink [--out DIR] [--steps N] "
                   "(`attn-course train-lm --help`)", add_help=False).add_argument("args", nargs=argparse.REMAINDER)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:                      # forward everything, --suite and --help included
        from .bench import main as bench_main
        return int(bench_main(argv[1:]) or 0)
    if argv[:1] == ["train-lm"]:
        from .pretrained import main as train_lm_main
        return int(train_lm_main(argv[1:]) or 0)
    if argv[:1] == ["ring"]:
        from .ring import main as ring_main
        return int(ring_main(argv[1:]) or 0)
    return grading_cli.run(_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
