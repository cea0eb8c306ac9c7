"""The capstone's training-seed spread, measured on the course's own design: writes
``attn_course/data/capstone_seed_spread.json``, which the leaderboard's tie band reads (lesson16.SEED_SD).

Run from the checkout (one CPU thread; about one minute of CPU time per seed):
    OMP_NUM_THREADS=1 PYTHONPATH=$PWD python tools/capstone_seed_spread.py [N_SEEDS]

Each seed trains the solutions notebook's design with the course's fixed recipe (lesson16.RECIPE) from that seed
(initialisation and batches) and measures the held-out loss the grader measures (the whole held-out split in
windows of KV_CONTEXT characters). The sample standard deviation over the seeds is the spread a design's graded
loss has from its training seed alone."""
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from attn_course.demos._train import fit
from attn_course.grading import notebook as nbk
from attn_course.grading.exercises import lesson16

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "attn_course" / "data" / "capstone_seed_spread.json"
SEEDS = (1, 2, 3, 4, 5)


def reference_make_model():
    nb = nbk.read(ROOT / "solutions" / "16_capstone_tiny_language_model.ipynb")
    ns = {"torch": torch, "F": F, "nn": nn}
    exec(nbk.source_of(nbk.exercise_cells(nb)["16_capstone"]), ns)
    return ns["make_model"]


def main(n: int) -> None:
    torch.set_num_threads(1)
    make_model, (x, y) = reference_make_model(), lesson16.heldout_windows()
    train = lesson16.training_codes()
    losses = []
    for seed in SEEDS[:n]:
        t0 = time.process_time()
        torch.manual_seed(seed)
        model = make_model(lesson16.VOCAB)
        fit(model, lesson16.sampler(train), steps=lesson16.RECIPE["steps"], lr=lesson16.RECIPE["lr"], seed=seed,
            progress=False, desc="seed spread")
        model.eval()
        with torch.no_grad():
            logits = torch.cat([model(chunk).float() for chunk in x.split(32)])
        loss, se = lesson16.loss_with_se(logits, y)
        losses.append(round(loss, 4))
        print(f"seed {seed}: held-out loss {loss:.4f} ± {2 * se:.4f} (2 s.e. over windows), "
              f"{time.process_time() - t0:.0f} CPU s", flush=True)
    sd = statistics.stdev(losses)
    record = {"design": "solutions/16_capstone_tiny_language_model.ipynb (the course's design)",
              "recipe": lesson16.RECIPE, "seeds": list(SEEDS[:n]), "held-out loss": losses,
              "mean": round(statistics.fmean(losses), 4), "sd": round(sd, 4),
              "python": sys.version.split()[0], "torch": torch.__version__,
              "command": "OMP_NUM_THREADS=1 PYTHONPATH=$PWD python tools/capstone_seed_spread.py " + str(n)}
    OUT.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(f"sd over {n} seeds: {sd:.4f} -> {OUT}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else len(SEEDS))
