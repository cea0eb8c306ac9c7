"""``attn-course bench``: the command line of the three benchmark suites (one parser, one runner)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .runner import default_device, describe_machine, machine_info, run_suite, save_record, spread, worker_main

__all__ = ["main", "parser", "resolve_args"]

SUITE_NAMES = ("attention", "sparse", "linear")          # --suite all: these three, one after the other

DESCRIPTION = """\
Benchmarks of the course, one runner for three suites:
  attention  naive attention vs flash_attention vs SDPA, forward and forward+backward (lesson 08)
  sparse     causal sliding-window attention five ways: dense masks, FlexAttention, flash_attention(window=) (lesson 09)
  linear     linear attention vs SDPA vs textbook softmax attention, forward (lesson 10)
  flash      the FlashAttention forward vs SDPA, one tuning step at a time (lesson 08; not in `all`)
  notebooks  every notebook executed headless (nbclient), its wall time recorded with the machine (not in `all`;
             `--rounds N`: N interleaved rounds and their median; `--taskset-one-core` pins it to one core,
             as `taskset -c 0 attn-course bench --suite notebooks`)

Method: each row (e.g. one L) in a fresh process; per method a first call, then the peak extra memory of one
call (CPU: RSS rise; CUDA: allocator peak); then all methods of the row timed together in --repeats
interleaved rounds after --warmup calls each, at --threads threads; the median and the spread (fastest,
slowest, every round) are recorded with the machine (CPU, cores, torch, threads, load average).

Duration on a 2-core CPU (printed once when a run starts): {quick_all} for `--suite all` at the quick
lengths (what `make bench` runs); {quick_one} for one suite; {full}."""

# How long a run takes on a 2-core CPU, as measured (the load average decides: every method of a row is timed in
# the same rounds, so load slows the run, not the comparison). Quoted by --help, by the line a run prints first,
# and by the README (tests/test_packaging.py keeps the README's figure equal to QUICK_ALL).
QUICK_ALL = "1.5 to 5 minutes (94 s measured at load average 2-3, 294 s at load 6-7: attention 100 s, " \
            "sparse 122 s of which 62 s compiling FlexAttention, linear 72 s)"
QUICK_ONE = "1 to 2 minutes"
FLASH_FULL = "about 2 minutes on a quiet machine (L=4096; 35 minutes measured at load average 20)"
FULL = "--full, the recorded grids, about 23 minutes (attention 13, sparse 6, linear 3)"
DESCRIPTION = DESCRIPTION.format(quick_all=QUICK_ALL, quick_one=QUICK_ONE, full=FULL)


def expected_duration(suite: str, full: bool) -> str:
    """The one line a run prints before it starts: how long it should take on a 2-core CPU."""
    if suite == "flash":
        return f"expected duration on a 2-core CPU: {FLASH_FULL if full else QUICK_ONE}"
    if full:
        return f"expected duration on a 2-core CPU: {FULL.removeprefix('--full, the recorded grids, ')}"
    return f"expected duration on a 2-core CPU: {QUICK_ALL if suite == 'all' else QUICK_ONE}"


def parser() -> argparse.ArgumentParser:
    from . import SUITES
    p = argparse.ArgumentParser(prog="attn-course bench", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", choices=[*SUITE_NAMES, "flash", "notebooks", "all"], default="attention",
                   help="which benchmark (default: attention; all: attention, sparse and linear, one after the other)")
    p.add_argument("--full", action="store_true",
                   help="the recorded grid (default lengths: " + "; ".join(
                       f"{n} {' '.join(map(str, SUITES[n].full['lengths']))}" for n in (*SUITE_NAMES, "flash"))
                   + ") instead of the quick one (" + "; ".join(
                       f"{n} {' '.join(map(str, SUITES[n].quick['lengths']))}" for n in (*SUITE_NAMES, "flash"))
                   + ")")
    p.add_argument("--lengths", type=int, nargs="+", default=None, metavar="L",
                   help="sequence lengths (default: the suite's quick lengths, or its full ones with --full)")
    p.add_argument("--methods", nargs="+", default=None, metavar="M",
                   help="subset of the suite's methods (default: all; attention: naive flash sdpa; sparse: naive "
                        "sdpa_mask sdpa_causal flex flash_window flash_causal; linear: linear sdpa naive linear_half; flash: "
                        "readable big_tiles tuned_exact tuned sdpa)")
    p.add_argument("--repeats", type=int, default=7, help="interleaved timed rounds per row; the median is reported "
                   "(default: 7)")
    p.add_argument("--warmup", type=int, default=1, help="untimed calls of each method before the rounds (default: 1)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads while measuring (default: 1; 0 keeps torch's default, one per core, which "
                        "a busy machine makes erratic: flash_attention's loop of small ops waits for a parked "
                        "thread at every op — lesson 08 §9 measures it)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available, else cpu)")
    p.add_argument("--batch", type=int, default=1, help="batch size B (default: 1)")
    p.add_argument("--heads", type=int, default=8, help="heads H (default: 8)")
    p.add_argument("--dim", type=int, default=64, help="head dimension (default: 64)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default: 0)")
    p.add_argument("--timeout", type=float, default=None, help="seconds per row before it is abandoned "
                   "(default: 1800; notebooks: per cell, default 600)")
    p.add_argument("--json", metavar="PATH", help="write the run in the recording format (with --suite all: a "
                   "folder, one file per suite named like the shipped recordings)")
    p.add_argument("--check", action="store_true",
                   help="evaluate the suite's targets; exit 1 if a measured one is missed (targets whose row "
                        "is not in this run's grid are skipped: use --full)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    a = p.add_argument_group("attention suite")
    a.add_argument("--modes", nargs="+", choices=["fwd", "fwd+bwd"], default=["fwd", "fwd+bwd"],
                   help="forward only, forward+backward, or both (default: both)")
    a.add_argument("--causal", choices=["no", "yes", "both"], default="both",
                   help="causal masking (attention, linear and flash suites; default: both)")
    a.add_argument("--block", type=int, default=128, help="flash tile size, and the BlockMask's (sparse) "
                   "(default: 128)")
    a.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default=None,
                   help="attention and linear suites (default: float16 on CUDA for attention, else float32)")
    a.add_argument("--sdpa-backend", choices=["flash", "efficient", "cudnn", "math"], default=None,
                   help="pin SDPA's kernel with torch.nn.attention.sdpa_kernel (default: let SDPA choose)")
    s = p.add_argument_group("sparse suite")
    s.add_argument("--window", type=int, default=256, help="sliding window W (default: 256)")
    s.add_argument("--naive-max", type=int, default=4096, help="largest L for the naive path, whose L×L "
                   "matrices take 6 GiB at L=8192 (default: 4096)")
    n = p.add_argument_group("notebooks suite")
    n.add_argument("--notebooks", nargs="+", default=None, metavar="NB",
                   help="notebooks to run (default: every notebooks/ and exercises/ notebook under --root)")
    n.add_argument("--solutions", action="store_true", help="also run solutions/")
    n.add_argument("--root", default=None, help="the course checkout (default: the current folder)")
    n.add_argument("--rounds", type=int, default=1, help="run the notebooks this many times, interleaved; each "
                   "row records every round and their median (default: 1)")
    n.add_argument("--taskset-one-core", action="store_true",
                   help="pin the run and its kernels to one core (records notebook_times_one_core.json)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    return p


def resolve_args(ns: argparse.Namespace, suite: str) -> dict:
    """The parameters one suite runs with (recorded as the run's ``args``)."""
    from . import SUITES
    s = SUITES[suite]
    grid = s.full if ns.full else s.quick
    device = ns.device or default_device()
    args = {"lengths": list(ns.lengths or grid["lengths"]), "methods": list(ns.methods or s.methods),
            "batch": ns.batch, "heads": ns.heads, "dim": ns.dim, "device": device, "repeats": ns.repeats,
            "warmup": ns.warmup, "threads": ns.threads, "seed": ns.seed, "full": ns.full}
    if suite == "attention":
        args.update(modes=list(ns.modes), causal=ns.causal, block=ns.block, sdpa_backend=ns.sdpa_backend,
                    dtype=ns.dtype or ("float16" if device.startswith("cuda") else "float32"))
    elif suite in ("linear", "flash"):
        args.update(causal=ns.causal, dtype=ns.dtype or "float32")
    else:
        args.update(window=ns.window, block=ns.block, naive_max=ns.naive_max, dtype="float32")
    bad = [m for m in args["methods"] if m not in s.methods]
    if bad:
        raise SystemExit(f"attn-course bench --suite {suite}: unknown method(s) {bad}; choose from {list(s.methods)}")
    return args


def _validate(ns) -> None:
    for name in ("batch", "heads", "dim", "block", "repeats", "window", "naive_max"):
        if getattr(ns, name) <= 0:
            raise SystemExit(f"attn-course bench: --{name.replace('_', '-')} must be positive, got {getattr(ns, name)}")
    if ns.warmup < 0 or ns.threads < 0:
        raise SystemExit(f"attn-course bench: --warmup and --threads must be >= 0, got {ns.warmup}, {ns.threads}")
    if ns.timeout is not None and ns.timeout <= 0:
        raise SystemExit(f"attn-course bench: --timeout must be positive, got {ns.timeout}")
    if ns.lengths and min(ns.lengths) <= 0:
        raise SystemExit(f"attn-course bench: --lengths must be positive, got {ns.lengths}")
    if ns.methods and ns.suite == "all":
        raise SystemExit("attn-course bench: --methods needs one --suite (each suite has its own methods)")


def run_one(suite: str, args: dict, *, timeout: float, progress=None, path: Path | None = None) -> dict:
    """Measure one suite: ``{"suite", "args", "machine", "rows"}`` (the recording format), saved to ``path``
    after every row (the load average "end" is then the latest one) and at the end."""
    machine = machine_info(args["device"], args["threads"])

    def save(rows):
        try:
            machine["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
        except (OSError, AttributeError):
            pass
        if path is not None:
            save_record(path, suite, args, machine, rows)
    rows = run_suite(suite, args, methods=args["methods"], timeout=timeout, progress=progress, on_row=save)
    save(rows)
    return {"suite": suite, "args": args, "machine": machine, "rows": rows}


def report(record: dict) -> str:
    """The text ``attn-course bench`` prints for one suite: parameters, method, machine, table, spread."""
    from . import SUITES
    s, args, rows = SUITES[record["suite"]], record["args"], record["rows"]
    mem = "allocator peak" if str(args["device"]).startswith("cuda") else "RSS rise"
    lines = [f"[{s.name}] {s.header(args)}",
             f"time: median of {args['repeats']} interleaved rounds after {args['warmup']} warm-up, "
             f"{args['threads'] or 'default'} thread(s); memory: peak extra ({mem}); one fresh process per row",
             f"machine: {describe_machine(record.get('machine', {}))}", "", s.format(rows)]
    worst = spread(rows, s.methods)
    if worst:
        lines.append(f"\nspread: slowest/fastest round of any cell at most {worst[0]:.2f}× ({worst[1]})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ns = parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if ns.worker:
        return worker_main(ns.worker)
    _validate(ns)
    if ns.suite == "notebooks":
        from .notebooks import main as notebooks_main
        return notebooks_main(ns)
    names = list(SUITE_NAMES) if ns.suite == "all" else [ns.suite]
    from . import SUITES
    progress = None if ns.quiet else (lambda msg: print(f"measuring {msg}", file=sys.stderr, flush=True))
    if not ns.quiet and not ns.lengths:
        print(expected_duration(ns.suite, ns.full), file=sys.stderr, flush=True)
    failed = False
    for name in names:
        path = None
        if ns.json:
            path = Path(ns.json)
            if ns.suite == "all":
                path.mkdir(parents=True, exist_ok=True)
                path = path / SUITES[name].recorded.name
        record = run_one(name, resolve_args(ns, name), timeout=ns.timeout or 1800.0, progress=progress, path=path)
        print(report(record), flush=True)
        if ns.check:
            print()
            for desc, value, ok in SUITES[name].check(record["rows"]):
                verdict = "SKIP" if value is None else "PASS" if ok else "FAIL"
                measured = "not in this run's grid" if value is None else f"measured {value:.3f}"
                print(f"{verdict}  {desc}  ({measured})")
                failed |= value is not None and not ok
        print()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
