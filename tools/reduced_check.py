"""Record the reduced-size reproduction check in a shipped model's JSON (tests/test_pretrained.py reads it):
the shipped recipe at a tiny size, trained from seeds 0, 1, 2 on this machine. Usage:
``python tools/reduced_check.py attn_course/data/pretrained``."""
import json
import sys
from pathlib import Path

from attn_course import pretrained as P

OVERRIDES = dict(d_model=32, num_layers=1, num_heads=2, context=64, batch_size=8, steps=40, warmup=4,
                 eval_every=20, eval_windows=8)

if __name__ == "__main__":
    root = Path(sys.argv[1])
    losses = [P.train("plain", None, log=lambda s: None, **dict(OVERRIDES, seed=s))["held_out_loss"] for s in (0, 1, 2)]
    path = root / "plain.json"
    rec = json.loads(path.read_text())
    rec["reduced_check"] = {"overrides": OVERRIDES, "seed_losses": losses}
    path.write_text(json.dumps(rec, indent=1))
    print("reduced-size held-out losses, seeds 0-2:", [round(x, 4) for x in losses])
