"""Run every notebook (lessons, solutions, exercises) top to bottom on this machine, as a learner would
(Run All), and record per-notebook wall time, errors and the device each lesson used.

    python tools/gpu_notebooks.py --out DIR [--jobs 3] [--only 07,08] [--dirs notebooks,solutions] [--timeout 600]

Writes DIR/notebooks.json (one row per notebook) and DIR/executed.tar.gz (the executed notebooks).
Errors do not stop a notebook (allow_errors): every failing cell is recorded with its exception.
A final probe cell reports ``device`` and the CUDA memory peak of the kernel.
"""
from __future__ import annotations

import argparse
import json
import os
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
PROBE = ("import json as _j, sys as _s\n_t = _s.modules.get('torch')\n"
         "print('PROBE' + _j.dumps({'device': str(globals().get('device')), "
         "'cuda_peak_bytes': (_t.cuda.max_memory_allocated() if _t is not None and _t.cuda.is_available() else None)}))")


def run(path: Path, timeout: int) -> dict:
    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(PROBE))
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(path.parent)}})
    t0 = time.perf_counter()
    try:
        client.execute()
        fatal = None
    except Exception as e:                                       # a timeout or a dead kernel
        fatal = f"{type(e).__name__}: {str(e)[:500]}"
    wall = time.perf_counter() - t0
    errors, probe = [], None
    for i, c in enumerate(nb.cells):
        for o in c.get("outputs", []):
            if o.get("output_type") == "error":
                errors.append({"cell": i, "ename": o["ename"], "evalue": o["evalue"][:400],
                               "source": "".join(c["source"])[:300]})
            if o.get("output_type") == "stream" and "PROBE{" in o.get("text", ""):
                probe = json.loads(o["text"].split("PROBE", 1)[1].strip().splitlines()[0])
    nb.cells.pop()
    return {"notebook": f"{path.parent.name}/{path.name}", "wall_s": round(wall, 1), "errors": errors,
            "fatal": fatal, "probe": probe, "nb": nb}


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="gpu_out")
    p.add_argument("--jobs", type=int, default=3)
    p.add_argument("--only", default="")
    p.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    p.add_argument("--dirs", default="notebooks,solutions,exercises")
    a = p.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [q for d in a.dirs.split(",") for q in sorted((ROOT / d).glob("*.ipynb"))
             if not a.only or q.name[:2] in a.only.split(",")]
    rows = []
    with ThreadPoolExecutor(a.jobs) as pool:
        for fut in as_completed([pool.submit(run, q, a.timeout) for q in paths]):   # recorded as each one ends
            r = fut.result()
            print(f"{r['notebook']}: {r['wall_s']} s, {len(r['errors'])} errors, probe {r['probe']}, fatal {r['fatal']}",
                  flush=True)
            for e in r["errors"]:
                print(f"   cell {e['cell']}: {e['ename']}: {e['evalue'][:200]}", flush=True)
            rows.append(r)
            (out / "notebooks.json").write_text(json.dumps([{k: v for k, v in x.items() if k != "nb"} for x in rows],
                                                           indent=1))
            with tarfile.open(out / "executed.tar.gz.part", "w:gz") as tar:    # renamed whole: a run cut off
                for x in rows:                                                   # keeps the last complete archive
                    tmp = out / "tmp.ipynb"
                    nbformat.write(x["nb"], tmp)
                    tar.add(tmp, arcname=x["notebook"])
                    tmp.unlink()
            os.replace(out / "executed.tar.gz.part", out / "executed.tar.gz")
    bad = [r["notebook"] for r in rows if r["errors"] or r["fatal"]]
    print(f"{len(rows)} notebooks, {len(bad)} with errors: {bad}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
