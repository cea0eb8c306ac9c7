"""``attn-course grade``: the instructor's bulk grader. Learner code is treated as hostile.

For each submission the grader (this process, trusted; it never imports or executes learner code):

1. reads the notebook as JSON and takes the *source* of its exercise cells, found by nbgrader
   ``grade_id`` (outputs, tags and other metadata are ignored); picks the ``solutions/`` notebook that
   defines those ids;
2. rebuilds the program: every non-exercise cell of the trusted solutions notebook, the learner's
   exercise cells in their places (a missing one becomes the released stub), and each
   ``check("<id>", expr)`` cell turned into "capture ``expr`` for exercise ``<id>``";
3. draws every exercise's inputs (held out: seeded by the exercise id and a hash of the learner's
   exercise cell, :func:`~attn_course.grading.selfcheck.held_out_seed` — the inputs ``check()`` draws
   under nbgrader autograde — or by ``--seed``; an exercise with a leaderboard gives the whole class one
   seed, :func:`~attn_course.grading.selfcheck.exercise_seed`) and writes them as safetensors;
4. runs the program in a child process (:mod:`._child`): ``python -I`` (isolated), scrubbed environment,
   a fresh temporary working directory, its own session/process group, resource limits (address space,
   CPU seconds, file size, open files, core dumps) and a wall-clock timeout, after which the whole
   process group is killed. A run that dies or times out costs the exercise it was working on; the
   program is re-run without that exercise's cell for the others;
5. loads the answers (safetensors: plain tensors, no pickle; size-capped, regular files only), validates
   them (type, keys, dtype, shape), and compares them with references computed here on the same inputs.
   The child runs learner code in :mod:`.sandbox` (no course modules, no threads or processes, no fused
   attention kernels, data stays in torch): a refusal fails its case with the rule's name, and the exercise
   gets 0 points. ``check()`` runs the same child (:class:`Zygote`), so both give the same points.

All output files are written after every child of the batch has been killed: ``grades.csv`` (contract
columns), ``<student>.json`` and ``<student>.feedback.md``, each atomically (temp file + ``os.replace``).
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from . import notebook as nbk
from .exercises import registry
from .selfcheck import exercise_seed, held_out_cases, judge_case
from .spec import Case, Exercise, validate

__all__ = ["Options", "Course", "grade_batch", "grade_submission", "collect", "grade_cli"]

MAX_NOTEBOOK_BYTES = 20 * 2**20        # a submission larger than this is rejected unread
MAX_ANSWER_BYTES = 64 * 2**20          # per exercise answers file
MAX_STATUS_BYTES = 256 * 2**10
TAIL_CHARS = 2000                      # excerpt of the learner's output kept in the JSON


@dataclass
class Options:
    timeout: float = 60.0              # wall-clock seconds per child run
    memory_mb: int = 4096              # RLIMIT_AS of the child
    file_mb: int = 64                  # RLIMIT_FSIZE of the child
    seed: int | None = None            # None: from each submission's content
    jobs: int = 1
    python: str = sys.executable
    lesson_timeout: dict = field(default_factory=dict)   # lesson -> its own CPU-seconds limit, set by calibrate()
    #   from the CPU time of the course's solution's run for a lesson with ``Exercise.time_factor``
    cpu_limit: float | None = None     # CPU seconds of one child (RLIMIT_CPU); None: ``timeout``


# ---- the course: trusted solutions notebooks -------------------------------------------------------------

class Course:
    """The trusted ``solutions/`` notebooks, indexed by the exercise ids they contain."""

    def __init__(self, root: str | Path | None = None):
        from .release import find_root               # here, not at import: nbformat takes seconds to import
        self.root = Path(root) if root is not None else find_root()
        self.lessons: dict[str, "nbformat.NotebookNode"] = {}
        self.ids: dict[str, list[str]] = {}
        reg = registry()
        for path in sorted((self.root / "solutions").glob("*.ipynb")):
            nb = nbk.read(path)
            self.lessons[path.stem] = nb
            self.ids[path.stem] = [gid for gid in nbk.exercise_cells(nb) if gid in reg]
        if not self.lessons:
            raise FileNotFoundError(f"no solutions notebooks in {self.root / 'solutions'}")

    def identify(self, sources: dict[str, str], stem: str) -> str | None:
        """The lesson whose exercise ids overlap the submission's most (ties: the lesson whose number
        starts the file name, then the first lesson); None when no id is known."""
        best, best_key = None, (0, False)
        for lesson, ids in self.ids.items():
            key = (len(set(ids) & set(sources)), stem.startswith(lesson[:3]))
            if key[0] > 0 and key > best_key:
                best, best_key = lesson, key
        return best

    def max_score(self, lesson: str) -> float:
        reg = registry()
        return float(sum(reg[i].points for i in self.ids[lesson]))

    def program(self, lesson: str, sources: dict[str, str], skip: dict[str, str] | set[str] = (),
                capture: set[str] | None = None) -> list[dict]:
        """The steps the child runs: trusted cells, the learner's exercise cells (except those in ``skip``)
        and a capture at each ``check`` of an exercise in ``capture`` (default: every one not skipped)."""
        reg = registry()
        steps: list[dict] = []
        for n, cell in enumerate(self.lessons[lesson].cells):
            if cell.cell_type != "code":
                continue
            gid = nbk.grade_id(cell)
            if gid in reg:
                if gid in skip:
                    continue
                src = sources.get(gid)
                if src is None:
                    src = nbk.stub_source(nbk.source_of(cell), gid)
                steps.append({"kind": "code", "source": nbk.strip_magics(src), "label": f"<exercise {gid}>",
                              "exercise": gid})
                continue
            for step in nbk.split_checks(nbk.source_of(cell)):
                if step[0] == "code":
                    steps.append({"kind": "code", "source": step[1], "label": f"<cell {n}>"})
                elif step[1] in self.ids[lesson] and step[1] not in skip and (capture is None or step[1] in capture):
                    steps.append({"kind": "capture", "id": step[1], "expr": step[2]})
        return steps


# ---- one child run ---------------------------------------------------------------------------------------

@dataclass
class RunOutcome:
    finished: bool                     # the program ran to its end (as far as the files say)
    timed_out: bool
    returncode: int | None
    answers: dict[str, tuple[dict, dict[str, torch.Tensor]]]      # id -> (status, tensors)
    output_tail: str
    seconds: float


def _nproc_limit() -> int | None:
    """RLIMIT_NPROC counts every process of the user: allow what runs now plus a margin (root ignores it)."""
    if not hasattr(os, "getuid") or os.getuid() == 0 or not os.path.isdir("/proc"):
        return None
    uid, count = str(os.getuid()), 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        m_uid = re.search(r"^Uid:\s+(\d+)", text, re.M)
        m_thr = re.search(r"^Threads:\s+(\d+)", text, re.M)
        if m_uid and m_uid.group(1) == uid:
            count += int(m_thr.group(1)) if m_thr else 1
    return count + 64


def _read_capped(path: Path, cap: int) -> bytes | None:
    """The bytes of a regular file (no symlink) of at most ``cap`` bytes, else None."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        import stat
        if not stat.S_ISREG(st.st_mode) or st.st_size > cap:
            return None
        with os.fdopen(fd, "rb") as f:
            fd = None
            data = f.read(cap + 1)
        return data if len(data) <= cap else None
    finally:
        if fd is not None:
            os.close(fd)


def _load_answers(out: Path, ex_id: str) -> tuple[dict, dict[str, torch.Tensor]] | None:
    from safetensors.torch import load
    raw_status = _read_capped(out / f"{ex_id}.json", MAX_STATUS_BYTES)
    raw = _read_capped(out / f"{ex_id}.safetensors", MAX_ANSWER_BYTES)
    if raw_status is None or raw is None:
        return None
    try:
        status = json.loads(raw_status)
        tensors = load(raw)
    except Exception:
        return None
    if not isinstance(status, dict) or not isinstance(tensors, dict):
        return None
    return status, tensors


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, 9)
    except (ProcessLookupError, PermissionError, AttributeError, OSError):
        pass


CHILD = str(Path(__file__).with_name("_child.py"))


def _job(steps: list[dict], cases: dict[str, list[Case]], opts: Options, hide) -> Path:
    """A job folder: ``inputs/`` (safetensors), ``program.json``, empty ``out/`` and ``work/``."""
    from safetensors.torch import save_file
    job = Path(tempfile.mkdtemp(prefix="attn-grade-"))
    for sub in ("inputs", "out", "work"):
        (job / sub).mkdir()
    for ex_id, cs in cases.items():
        flat = {f"{i}/{k}": v.detach().cpu().contiguous().clone() for i, c in enumerate(cs)
                for k, v in c.inputs.items()}
        save_file(flat, str(job / "inputs" / f"{ex_id}.safetensors"))
    program = {
        "steps": steps,
        "hide": [str(p) for p in hide],      # e.g. solutions/: the child may not open it
        "cases": {ex_id: [{"name": c.name, "params": c.params} for c in cs] for ex_id, cs in cases.items()},
        "limits": {"memory_mb": opts.memory_mb, "cpu_s": int(opts.cpu_limit or opts.timeout) + 2, "file_mb": opts.file_mb,
                   "nofile": 256, "nproc": _nproc_limit()},
    }
    (job / "program.json").write_text(json.dumps(program), encoding="utf-8")
    return job


def _outcome(job: Path, cases, timed_out: bool, returncode, seconds: float) -> RunOutcome:
    answers = {}
    for ex_id in cases:
        loaded = _load_answers(job / "out", ex_id)
        if loaded is not None:
            answers[ex_id] = loaded
    done = (job / "out" / "done").is_file()
    tail = (_read_capped(job / "output.txt", 2**31) or b"")[-TAIL_CHARS:].decode("utf-8", "replace")
    return RunOutcome(done and not timed_out and returncode == 0, timed_out, returncode, answers, tail, seconds)


_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}


def run_child(steps: list[dict], cases: dict[str, list[Case]], opts: Options,
              hide: list[str] = (), zygote: "Zygote | None" = None) -> RunOutcome:
    """Run ``steps`` in a sandboxed child — a fresh ``python -I`` process, or a fork of ``zygote`` — and return
    whatever answers it left behind."""
    job = _job(steps, cases, opts, hide)
    try:
        t0 = time.monotonic()
        if zygote is not None:
            timed_out, rc = zygote.run(job, opts.timeout)
            return _outcome(job, cases, timed_out, rc, time.monotonic() - t0)
        env = {**_ENV, "HOME": str(job / "work"), "TMPDIR": str(job / "work")}
        if os.name == "nt":
            env["SYSTEMROOT"] = os.environ.get("SYSTEMROOT", "")
        with open(job / "output.txt", "wb") as log:
            proc = subprocess.Popen([opts.python, "-I", CHILD, str(job)], cwd=job / "work", env=env,
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=(os.name != "nt"))
            timed_out = False
            try:
                proc.wait(timeout=opts.timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(proc)                         # the child and anything it started
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
        return _outcome(job, cases, timed_out, proc.returncode, time.monotonic() - t0)
    finally:
        shutil.rmtree(job, ignore_errors=True)


class Zygote:
    """A ``python -I _child.py --serve`` process that has imported torch once and forks a fresh sandboxed child
    per job (``check()``: one per kernel, started in the background when ``attn_course.grading`` is imported, so
    a check costs a fork and the exercise's own work, not torch's import). Restarted if it died."""

    def __init__(self, python: str = sys.executable):
        self.python, self.proc = python, None
        self.cpu_s = 0.0                   # CPU seconds (user + system) of the last job's child

    def start(self) -> "Zygote":
        if self.proc is None or self.proc.poll() is not None:
            env = {**_ENV, "HOME": tempfile.gettempdir(), "TMPDIR": tempfile.gettempdir()}
            self.proc = subprocess.Popen([self.python, "-I", CHILD, "--serve"], env=env, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1,
                                         start_new_session=True)
        return self

    def _line(self, deadline: float) -> str | None:
        import select
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
            return None
        return self.proc.stdout.readline().strip() or None

    def run(self, job: Path, timeout: float) -> tuple[bool, int | None]:
        """(timed out, exit status) of one job; the child's process group is killed at ``timeout``."""
        self.start()
        if not getattr(self.proc, "ready", False):
            if self._line(time.monotonic() + 180) != "ready":          # torch's import, once per kernel
                self.close()
                return True, None
            self.proc.ready = True
        self.proc.stdin.write(f"{job}\n")
        self.proc.stdin.flush()
        line = self._line(time.monotonic() + 30)
        if line is None or not line.startswith("pid "):
            self.close()
            return True, None
        done = self._line(time.monotonic() + timeout)
        if done is None:
            try:
                os.killpg(int(line.split()[1]), 9)
            except OSError:
                pass
            if self._line(time.monotonic() + 10) is None:
                self.close()
            return True, None
        _, status, self.cpu_s = done.split()
        self.cpu_s = float(self.cpu_s)
        return False, os.waitstatus_to_exitcode(int(status))

    def close(self) -> None:
        if self.proc is not None:
            _kill_group(self.proc)
            self.proc = None


# ---- grading one submission ------------------------------------------------------------------------------

@dataclass
class Submission:
    path: Path
    student_id: str


def _case_results(ex: Exercise, cases: list[Case], status: dict, tensors: dict) -> list[dict]:
    entries = status.get("cases") if isinstance(status.get("cases"), list) else []
    results = []
    for i, case in enumerate(cases):
        entry = entries[i] if i < len(entries) and isinstance(entries[i], dict) else {}
        kind = entry.get("status")
        if kind == "not attempted":
            results.append({"name": case.name, "ok": False, "hint": "not attempted"})
            continue
        if kind == "error":
            results.append({"name": case.name, "ok": False,
                            "hint": _short(ex.explain_error(case, str(entry.get("error", "error"))), 600)})
            continue
        prefix = f"{i}/"
        got = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
        if kind != "ok" or not got:
            results.append({"name": case.name, "ok": False, "hint": "no answer"})
            continue
        want = ex.expected(case)
        r = judge_case(ex, got, want, case)
        results.append({"name": case.name, "ok": r.ok, "hint": r.message})
        if ex.measure_fn is not None and validate(got, want) is None:      # the capstone's leaderboard numbers
            try:
                results[-1]["measured"] = {str(k): v for k, v in ex.measure_fn(got, case).items()}
            except Exception:
                pass
    return results


def refused_rules(status: dict) -> str:
    """The sandbox rules a child's status says were refused (``rule: a; rule: b``), or ""."""
    entries = status.get("cases") if isinstance(status.get("cases"), list) else []
    rules = {str(e["refused"]) for e in entries if isinstance(e, dict) and e.get("refused")}
    rules = sorted(rules | ({str(status["cell_refused"])} if status.get("cell_refused") else set()))
    return "; ".join(f"rule: {r}" for r in rules)


def _short(text, n: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 3] + "..."


def grade_submission(sub: Submission, course: Course, opts: Options) -> dict:
    """Grade one submission; never raises. Returns the report written to ``<student>.json``."""
    report: dict = {"student_id": sub.student_id, "submission": str(sub.path), "lesson": None,
                    "total": 0.0, "max_score": 0.0, "error": None, "exercises": {}}
    t0 = time.monotonic()
    try:
        _grade_into(report, sub, course, opts)
    except Exception as exc:                               # a grader bug must not stop the batch
        report["error"] = f"internal grader error: {type(exc).__name__}: {_short(exc)}"
        report["total"] = 0.0
    report["_seconds"] = time.monotonic() - t0
    return report


def _grade_into(report: dict, sub: Submission, course: Course, opts: Options) -> None:
    if sub.path.suffix != ".ipynb":
        report["error"] = f"not a notebook ({sub.path.name})"
        return
    raw = _read_capped(sub.path, MAX_NOTEBOOK_BYTES)
    if raw is None:
        report["error"] = f"unreadable, not a regular file, or larger than {MAX_NOTEBOOK_BYTES // 2**20} MiB"
        return
    try:
        sources = nbk.submission_sources(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        report["error"] = _short(exc)
        return
    lesson = course.identify(sources, sub.path.stem)
    if lesson is None:
        report["error"] = "no exercise of this course found (no known nbgrader grade_id)"
        return
    reg = registry()
    ids = course.ids[lesson]
    if lesson in opts.lesson_timeout:                        # e.g. the capstone: TIME_FACTOR x the solution's run
        opts = cpu_limited(opts, opts.lesson_timeout[lesson])
    report["_time_limit_s"] = round(opts.timeout, 1)        # private: measured, so not written (determinism)
    report["lesson"] = lesson
    report["max_score"] = course.max_score(lesson)
    # held-out inputs: per exercise, from the learner's cell (the same as check() under nbgrader autograde);
    # one seed for the whole class where the exercise ranks a class (exercise_seed)
    bases = {i: opts.seed if opts.seed is not None else exercise_seed(reg[i], sources.get(i)) for i in ids}
    report["seeds"] = {i: "the instructor's class seed" if reg[i].rank_by else b for i, b in bases.items()}
    report["_class_seed"] = next((b for i, b in bases.items() if reg[i].rank_by), None)   # class_seed.txt only
    cases = {i: held_out_cases(reg[i], bases[i]) for i in ids}

    skip: dict[str, str] = {}
    answers: dict[str, tuple[dict, dict]] = {}
    tail = ""
    runs = []
    for _ in range(len(ids) + 1):
        todo = {i: cases[i] for i in ids if i not in answers and i not in skip}
        if not todo:
            break
        outcome = run_child(course.program(lesson, sources, skip, set(todo)), todo, opts,
                            hide=[course.root / "solutions"])
        runs.append(round(outcome.seconds, 3))
        tail = outcome.output_tail
        for i, a in outcome.answers.items():
            answers.setdefault(i, a)
        if outcome.finished:
            break
        pending = [i for i in ids if i not in answers and i not in skip]
        if not pending:
            break
        skip[pending[0]] = ("ran past the time limit" if outcome.timed_out else
                            f"ran past the limit of {opts.cpu_limit:.0f} CPU seconds" if _out_of_cpu(outcome, opts) else
                            f"crashed the grading process (exit status {outcome.returncode})")
    report["runs"] = len(runs)

    for i in ids:
        ex = reg[i]
        entry: dict = {"title": ex.title, "points": 0.0, "max_points": float(ex.points), "status": "graded",
                       "cases": [], "notes": []}
        report["exercises"][i] = entry
        if i not in sources:
            entry["status"] = "missing"
            entry["notes"].append("no exercise cell with this grade_id in the submission")
        if i in skip:
            entry["status"] = "failed"
            entry["notes"].append(f"your code {skip[i]}; this exercise gets 0 points")
            continue
        if i not in answers:
            entry["status"] = "failed"
            entry["notes"].append("no answer came back from the grading process")
            continue
        status, tensors = answers[i]
        if status.get("cell_error"):
            entry["notes"].append(f"your cell raised {_short(status['cell_error'])}")
        if status.get("capture_error"):
            entry["notes"].append(f"the object to check was not defined: {_short(status['capture_error'])}")
        entry["cases"] = _case_results(ex, cases[i], status, tensors)
        if ex.measure_fn is not None:                      # the capstone: what was measured, for the leaderboard
            entry["measured"] = {k: v for c in entry["cases"] for k, v in c.pop("measured", {}).items()}
        rules = refused_rules(status)
        if rules:
            entry["status"] = "forbidden"
            entry["notes"].append(f"the sandbox refused your code ({rules}), which this exercise forbids: 0 points")
            continue
        if entry["cases"] and all(c["hint"] == "not attempted" for c in entry["cases"]):
            entry["status"] = "not attempted"
        entry["points"] = ex.score(sum(c["ok"] for c in entry["cases"]), len(entry["cases"]))
    report["total"] = float(sum(e["points"] for e in report["exercises"].values()))
    report["output_tail"] = tail
    report["_runs_seconds"] = runs


# ---- the batch -------------------------------------------------------------------------------------------

NBGRADER_STEPS = ("submitted", "autograded", "feedback")     # nbgrader's {step}/{student}/{assignment}/


def _student_of(f: Path) -> str | None:
    """The student of a notebook in nbgrader's layout ``<step>/<student>/<assignment>/<notebook>.ipynb``."""
    parts = f.parts
    if len(parts) >= 4 and parts[-4] in NBGRADER_STEPS:
        return parts[-3]
    return None


def _distinguishing_folder(group: list[Path]) -> list[str] | None:
    """For notebooks sharing a file name: the name of the nearest enclosing folder level at which their
    paths all differ (``class/alice/hw/lesson.ipynb`` and ``class/bob/hw/lesson.ipynb``: alice, bob)."""
    depth = min(len(f.parts) for f in group)
    for k in range(2, depth + 1):
        names = [f.parts[-k] for f in group]
        if len(set(names)) == len(names):
            return names
    return None


def student_ids(files: list[Path], owners: list[Path | None] | None = None) -> list[str]:
    """A unique student id per file, taken from where the file lies (see :func:`collect`). ``owners[n]``:
    the folder directly under the folder the instructor named that holds ``files[n]`` (None for a file
    named directly or lying at the top of that folder)."""
    owners = owners or [None] * len(files)
    ids: list[str | None] = [None] * len(files)
    stems = [f.stem if f.suffix == ".ipynb" else f.name.split(".")[0] or f.name for f in files]
    for n, f in enumerate(files):                              # 1. nbgrader's layout: the student folder
        ids[n] = _student_of(f)
    by_folder: dict[str, list[int]] = {}
    for n, owner in enumerate(owners):                         # 2. one folder per student: the folder
        if ids[n] is None and owner is not None:
            by_folder.setdefault(owner.name, []).append(n)
    for name, group in by_folder.items():
        dirs = sorted({owners[n] for n in group})
        names = _distinguishing_folder([d / "_" for d in dirs]) if len(dirs) > 1 else [name]
        for n in group:                                        # same name, other folders: what tells them apart
            ids[n] = names[dirs.index(owners[n])] if names else name
    by_stem: dict[str, list[int]] = {}
    for n, stem in enumerate(stems):
        if ids[n] is None:
            by_stem.setdefault(stem, []).append(n)
    for stem, group in by_stem.items():
        if len(group) == 1:                                    # 3. a unique file name: its stem
            ids[group[0]] = stem
            continue
        names = _distinguishing_folder([files[n] for n in group])   # 4. shared file names: the folder
        for j, n in enumerate(group):
            ids[n] = names[j] if names else stem
    count: dict[str, int] = {}
    for sid in ids:
        count[sid] = count.get(sid, 0) + 1
    out, seen = [], {}
    for n, sid in enumerate(ids):
        if count[sid] > 1 and sid != stems[n]:                 # one student, several notebooks
            sid = f"{sid}/{stems[n]}"
        k = seen.get(sid, 0) + 1
        seen[sid] = k
        out.append(sid if k == 1 else f"{sid}_{k}")
    return out


def collect(paths: list[str | Path]) -> list[Submission]:
    """The submissions under ``paths`` and their student ids.

    A file given by name is graded as given (a non-notebook becomes an error row). A folder contributes
    every ``*.ipynb`` inside it, recursively and sorted; hidden files and folders (``.ipynb_checkpoints``)
    and non-notebook files (nbgrader's ``timestamp.txt``, notes) are ignored. Student ids:

    1. nbgrader's layout ``.../submitted/<student>/<assignment>/<notebook>.ipynb`` (also ``autograded/``,
       ``feedback/``): ``<student>``;
    2. one folder per student (``class/carol/Copy of 01_….ipynb``, ``class/bob/hw2/lesson09.ipynb``): the
       folder directly under the folder given — whatever the notebook is called;
    3. otherwise a notebook whose file name no other submission shares: its stem (``alice.ipynb``: alice);
    4. notebooks sharing a file name: the nearest enclosing folder whose name tells them apart.

    A student with several notebooks gets ``<student>/<notebook stem>``; any remaining clash ``_2``, ``_3`` …"""
    files: list[Path] = []
    owners: list[Path | None] = []
    for p in map(Path, paths):
        if p.is_dir():
            for f in sorted(p.rglob("*.ipynb")):
                rel = f.relative_to(p).parts
                if f.is_file() and not any(part.startswith(".") for part in rel):
                    files.append(f)
                    owners.append(Path(os.path.abspath(p / rel[0])) if len(rel) > 1 else None)
        else:
            files.append(p)
            owners.append(None)
    absolute = [Path(os.path.abspath(f)) for f in files]
    return [Submission(f, sid) for f, sid in zip(files, student_ids(absolute, owners))]


def _safe_name(student_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", student_id).lstrip(".") or "student"


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    os.replace(tmp, path)


def _fmt(x: float) -> str:
    return f"{x:g}"


def feedback_text(report: dict) -> str:
    """The learner-facing feedback file (markdown)."""
    lines = [f"# Feedback for {report['student_id']}", ""]
    if report["error"]:
        out_of = "" if report["max_score"] is None else f" / {_fmt(report['max_score'])}"
        lines += [f"**This submission could not be graded:** {report['error']}", "",
                  f"Score: 0{out_of}", ""]
        return "\n".join(lines)
    lines += [f"Lesson: `{report['lesson']}` — score **{_fmt(report['total'])} / {_fmt(report['max_score'])}**", ""]
    for ex_id, e in report["exercises"].items():
        lines.append(f"## {ex_id} — {e['title']}: {_fmt(e['points'])} / {_fmt(e['max_points'])}")
        for note in e["notes"]:
            lines.append(f"- note: {note}")
        if e["status"] == "not attempted":
            lines += ["- not attempted", ""]
            continue
        for c in e["cases"]:
            lines.append(f"- {'✓' if c['ok'] else '✗'} {c['name']}" + (f": {c['hint']}" if c["hint"] else ""))
        lines.append("")
    lines.append("Inputs were drawn at grading time; your notebook's own outputs were not used.")
    return "\n".join(lines) + "\n"


def _error_row_max(report: dict, course: Course, lessons: list[str]) -> float | None:
    """An ungradable submission's out-of: its file name's lesson (``01_….ipynb``), else the batch's only
    lesson, else unknown (None) — the same number in grades.csv and in its feedback."""
    stem = Path(report["submission"]).name
    named = [lesson for lesson in course.ids if stem.startswith(lesson[:3])]
    if len(named) == 1:
        return course.max_score(named[0])
    return course.max_score(lessons[0]) if len(lessons) == 1 else None


def write_outputs(reports: list[dict], course: Course, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    lessons = [lesson for lesson in course.ids if any(r["lesson"] == lesson for r in reports)]
    columns = [i for lesson in lessons for i in course.ids[lesson]]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["student_id", *columns, "total", "max_score"])
    for r in reports:
        if r["lesson"] is None:
            r["max_score"] = _error_row_max(r, course, lessons)
            row = ["0"] * len(columns) + ["0", "" if r["max_score"] is None else _fmt(r["max_score"])]
        else:
            row = [_fmt(r["exercises"][c]["points"]) if c in r["exercises"] else "" for c in columns]
            row += [_fmt(r["total"]), _fmt(r["max_score"])]
        w.writerow([r["student_id"], *row])
        public = {k: v for k, v in r.items() if not k.startswith("_")}
        name = _safe_name(r["student_id"])
        _write_atomic(out / f"{name}.json", json.dumps(public, indent=2, ensure_ascii=False) + "\n")
        _write_atomic(out / f"{name}.feedback.md", feedback_text(r))
    _write_atomic(out / "grades.csv", buf.getvalue())
    write_leaderboards(reports, [c for c in columns if registry()[c].rank_by], out)
    return out / "grades.csv"


class SettingsError(ValueError):
    """The grader's settings would cost correct work its points (found on the course's own solutions)."""


class NothingToGrade(ValueError):
    """A folder given to the grader holds no notebook: grading nothing is an instructor's mistake (the wrong
    folder, the wrong level, submissions still zipped), never an empty grade sheet that looks like success."""


def check_not_empty(paths: list[str | Path]) -> None:
    """Raise :class:`NothingToGrade` naming every folder in ``paths`` that holds no ``*.ipynb`` submission
    (hidden folders such as ``.ipynb_checkpoints`` do not count), with what it holds instead."""
    empty = []
    for p in map(Path, paths):
        if p.is_dir() and not collect([p]):
            files = [f for f in p.rglob("*") if f.is_file()]
            kinds = sorted({f.suffix or f.name for f in files})[:5]
            zipped = [f for f in files if f.suffix.lower() in (".zip", ".tar", ".gz", ".tgz", ".7z")]
            what = ("it is empty" if not files else f"it holds {len(files)} file(s) ({', '.join(kinds)}) but no .ipynb"
                    + ("; extract the archives first" if zipped else ""))
            empty.append(f"{p} ({what})")
    if empty:
        raise NothingToGrade("no notebook to grade in " + "; ".join(empty)
                             + ": give the folder of learners' .ipynb files (one per learner, or one folder per learner)")


CALIBRATION_TIMEOUT = 900.0             # the most a lesson's solution may take when its limit is derived from it


def calibrate(course: Course, lessons: list[str], opts: Options) -> None:
    """Grade the trusted ``solutions/`` notebook of every lesson in the batch under ``opts`` first: if the
    course's own solutions lose a point (a timeout or memory limit too small for this machine), the
    settings are at fault, not the learners — raise :class:`SettingsError` before anyone is graded.

    A lesson with an exercise whose ``time_factor`` is set (the capstone) gets its own limit, derived here from
    the measurement: ``time_factor`` × the CPU seconds the solution's children used on this machine (their
    ``getrusage`` times: what a loaded machine does not change, unlike wall time; under a ceiling of
    :data:`CALIBRATION_TIMEOUT` for that run), and never below ``--timeout``; it is stored in
    ``opts.lesson_timeout`` and enforced as a CPU-time limit (:func:`cpu_limited`). Calibration runs alone, before
    the batch's pool starts, so the children's times are the solution's own."""
    reg = registry()
    for lesson in lessons:
        path = course.root / "solutions" / f"{lesson}.ipynb"
        factor = max([reg[i].time_factor for i in course.ids[lesson]] + [0.0])
        run_opts = replace(opts, timeout=max(opts.timeout, CALIBRATION_TIMEOUT)) if factor > 0 else opts
        cpu0 = _children_cpu()
        r = grade_submission(Submission(path, "course solutions"), course, run_opts)
        cpu = _children_cpu() - cpu0
        if r["error"] or r["total"] < r["max_score"]:
            lost = [f"{i}: {e['cases'][0]['hint'] if e['cases'] else e['status']}" for i, e in r["exercises"].items()
                    if e["points"] < e["max_points"]][:3]
            raise SettingsError(
                f"the course's own solutions to {lesson} score {_fmt(r['total'])}/{_fmt(r['max_score'])} under "
                f"--timeout {run_opts.timeout:g} --memory {opts.memory_mb} on this machine"
                + (f" ({r['error']})" if r["error"] else f" ({'; '.join(_short(x, 160) for x in lost)})")
                + ": these settings would charge learners for them; raise --timeout / --memory and grade again")
        if factor > 0:
            opts.lesson_timeout[lesson] = max(opts.timeout, factor * cpu)


WALL_SLACK = 4.0                        # the wall-clock backstop of a CPU-limited run: this many times its CPU limit


def _children_cpu() -> float:
    """CPU seconds (user + system) of this process's finished children so far."""
    try:
        import resource
    except ImportError:                                  # Windows: no rusage, no CPU limit (see docs/grading.md)
        return 0.0
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def cpu_limited(opts: Options, cpu_seconds: float) -> Options:
    """``opts`` for a lesson whose limit is ``cpu_seconds`` of CPU time (``RLIMIT_CPU`` of the child), with a
    wall-clock backstop of :data:`WALL_SLACK` × that (for a child that sleeps or waits), never below --timeout."""
    return replace(opts, cpu_limit=cpu_seconds, timeout=max(opts.timeout, WALL_SLACK * cpu_seconds))


def _out_of_cpu(outcome: "RunOutcome", opts: Options) -> bool:
    """The child was killed by its CPU-time limit (SIGXCPU at the soft limit, SIGKILL at the hard one)."""
    import signal
    return opts.cpu_limit is not None and outcome.returncode in (-getattr(signal, "SIGXCPU", 24), -9)


def _lessons_of(subs: list[Submission], course: Course) -> list[str]:
    """The lessons the batch's notebooks belong to (read as JSON only; unreadable files are skipped)."""
    found = set()
    for sub in subs:
        raw = _read_capped(sub.path, MAX_NOTEBOOK_BYTES) if sub.path.suffix == ".ipynb" else None
        try:
            lesson = course.identify(nbk.submission_sources(raw.decode("utf-8")), sub.path.stem) if raw else None
        except (ValueError, UnicodeDecodeError):
            lesson = None
        if lesson:
            found.add(lesson)
    return [lesson for lesson in course.ids if lesson in found]


def grade_batch(paths: list[str | Path], out: str | Path, opts: Options | None = None,
                root: str | Path | None = None, progress: bool = True, check_settings: bool = True) -> list[dict]:
    """Grade every submission under ``paths`` into ``out``; returns the reports in input order. With
    ``check_settings`` the course's solutions are graded first (:func:`calibrate`)."""
    from tqdm.auto import tqdm
    opts = opts or Options()
    course = Course(root)
    check_not_empty(paths)
    subs = collect(paths)
    if check_settings:
        calibrate(course, _lessons_of(subs, course), opts)
    reports: list[dict | None] = [None] * len(subs)
    with ThreadPoolExecutor(max_workers=max(1, opts.jobs)) as pool, \
            tqdm(total=len(subs), desc="grading", unit="notebook", disable=not progress) as bar:
        futures = {pool.submit(grade_submission, s, course, opts): n for n, s in enumerate(subs)}
        for fut in as_completed(futures):
            reports[futures[fut]] = fut.result()
            bar.update(1)
    write_outputs(reports, course, Path(out))
    return reports


def grade_cli(args) -> int:
    def fail(msg: str) -> int:
        print(f"attn-course grade: {msg}", file=sys.stderr)
        return 2
    missing = [p for p in args.submissions if not Path(p).exists()]
    if missing:
        return fail(f"no such file or folder: {', '.join(missing)}")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        return fail(f"--out {args.out} is a file; give a folder (it is created if missing)")
    try:
        course = Course(args.root)
    except FileNotFoundError as exc:
        return fail(f"{exc}: run it from the course checkout, or pass --root /path/to/the/checkout "
                    "(the folder holding solutions/)")
    opts = Options(timeout=args.timeout, memory_mb=args.memory, seed=args.seed, jobs=args.jobs)
    t0 = time.monotonic()
    try:
        reports = grade_batch(args.submissions, args.out, opts, root=course.root, progress=not args.quiet)
    except (SettingsError, NothingToGrade) as exc:
        return fail(f"nothing was graded: {exc}")
    elapsed = time.monotonic() - t0
    errors = [r for r in reports if r["error"]]
    per = [r["_seconds"] for r in reports if not r["error"]]
    print(f"graded {len(reports)} submission(s) in {elapsed:.1f} s"
          + (f" ({sum(per) / len(per):.1f} s each on average, {opts.jobs} in parallel)" if per else "")
          + f"; results in {Path(args.out) / 'grades.csv'}", file=sys.stderr)
    for r in errors:
        print(f"  error: {r['student_id']}: {r['error']}", file=sys.stderr)
    return 0


# ---- the capstone's leaderboard (lesson 16) --------------------------------------------------------------

def leaderboard_rows(reports: list[dict], ex_id: str) -> list[dict]:
    """One row per submission of the open exercise ``ex_id``: its measured numbers, ``within budget`` (every
    budget check it measured passed, and each was measured) and ``rank`` — 1, 2, … by ``rank_by`` ascending among
    the submissions within budget; None (unranked, listed after them) otherwise."""
    ex = registry()[ex_id]
    rows = []
    for r in reports:
        e = (r.get("exercises") or {}).get(ex_id)
        if e is None:
            continue
        m = e.get("measured") or {}
        checks = [v for v in m.values() if isinstance(v, bool)]
        value = m.get(ex.rank_by)
        ok = (bool(checks) and all(checks) and len(checks) == len(_budget_keys(reports, ex_id))
              and isinstance(value, (int, float)) and value == value)
        rows.append({"student_id": r["student_id"], **{k: v for k, v in m.items() if not isinstance(v, bool)},
                     "within budget": ok, "points": e["points"], "max_points": e["max_points"]})
    ranked = sorted((row for row in rows if row["within budget"]), key=lambda row: (row[ex.rank_by], row["student_id"]))
    for n, row in enumerate(ranked, 1):
        row["rank"] = n
        if ex.rank_noise:                          # the first better-ranked row it cannot be told apart from
            row["within noise of"] = next((f"#{other['rank']}" for other in ranked[:n - 1]
                                           if _within_noise(row, other, ex)), "")
    rest = sorted((row for row in rows if not row["within budget"]), key=lambda row: row["student_id"])
    for row in rest:
        row["rank"] = None
    return ranked + rest


SEED_SD_KEY = "seed s.d."               # measured: the s.d. of rank_by over training seeds (stored with the release)
PAIRED_KEY = "per-window loss"          # measured: rank_by per held-out window, the same windows for every design


def tie_band(a: dict, b: dict, ex) -> float | None:
    """Half-width (2 standard deviations) of the difference of two rows' ``rank_by``: the training seeds' spread
    of each (``seed s.d.``: independent seeds, so 2σ² for two designs at σ) and the held-out sample's, added as
    independent variances. The sample's part is the PAIRED one — every design is measured on the same windows, so
    what separates two designs is the s.e. of their per-window differences — when both rows carry their
    per-window values; else the two rows' ``rank_noise`` (± 2 s.e. each) in quadrature. None without a noise."""
    pa, pb = a.get(PAIRED_KEY), b.get(PAIRED_KEY)
    if isinstance(pa, list) and isinstance(pb, list) and len(pa) == len(pb) > 1:
        d = [x - y for x, y in zip(pa, pb)]
        mean = sum(d) / len(d)
        var_sample = sum((x - mean) ** 2 for x in d) / (len(d) - 1) / len(d)
    else:
        na, nb = a.get(ex.rank_noise), b.get(ex.rank_noise)
        if not all(isinstance(v, (int, float)) and v == v for v in (na, nb)):
            return None
        var_sample = (na / 2) ** 2 + (nb / 2) ** 2
    sa, sb = (row.get(SEED_SD_KEY, 0.0) for row in (a, b))
    sa, sb = (v if isinstance(v, (int, float)) and v == v else 0.0 for v in (sa, sb))
    return 2 * math.sqrt(sa ** 2 + sb ** 2 + var_sample)


def _within_noise(a: dict, b: dict, ex) -> bool:
    """|a − b| ≤ :func:`tie_band` of the two rows; a row without its noise is never within noise."""
    band = tie_band(a, b, ex)
    return band is not None and abs(a[ex.rank_by] - b[ex.rank_by]) <= band


def _budget_keys(reports: list[dict], ex_id: str) -> set[str]:
    """Every budget check (boolean measured value) any submission of ``ex_id`` reported."""
    return {k for r in reports for k, v in (((r.get("exercises") or {}).get(ex_id) or {}).get("measured") or {}).items()
            if isinstance(v, bool)}


def write_leaderboards(reports: list[dict], ex_ids: list[str], out: Path) -> None:
    """``leaderboard.csv`` and ``leaderboard.md`` beside grades.csv for an open exercise with ``rank_by``
    (one file pair; with several such exercises, ``leaderboard_<id>.*``), and ``class_seed.txt``: the class seed
    the batch used (the instructor's; ``--seed`` with it grades a late submission on the same draw)."""
    seeds = sorted({r["_class_seed"] for r in reports if r.get("_class_seed") is not None})
    if ex_ids and seeds:
        _write_atomic(out / "class_seed.txt", "\n".join(map(str, seeds)) + "\n")
    for ex_id in ex_ids:
        rows = leaderboard_rows(reports, ex_id)
        if not rows:
            continue
        stem = "leaderboard" if len(ex_ids) == 1 else f"leaderboard_{ex_id}"
        keys = [k for row in rows for k in row if k not in ("rank", "student_id", "within budget", "points",
                                                             "max_points")]
        keys = list(dict.fromkeys(keys))
        keys = [k for k in keys if k != "within noise of" and all(not isinstance(row.get(k), (list, dict))
                                                                  for row in rows)]
        ex = registry()[ex_id]
        cols = ["rank", *(["within noise of"] if ex.rank_noise else []), "student_id", *keys, "within budget",
                "points"]

        def cell(row, k):
            v = row.get(k)
            if v is None:
                return ""
            if isinstance(v, bool):
                return "yes" if v else "no"
            return _fmt(v) if isinstance(v, (int, float)) else str(v)
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(cols)
        for row in rows:
            w.writerow([cell(row, k) for k in cols])
        _write_atomic(out / f"{stem}.csv", buf.getvalue())
        noise = (f" Every design was trained from the same seed (the instructor's class seed) and measured on the "
                 f"same held-out windows. \"within noise of #k\": its {ex.rank_by} differs from #k's by less than "
                 f"2 standard deviations of their difference — another training seed (s.d. {SEED_SD_KEY} of each, "
                 f"measured on the course's design) and the held-out sample (paired, window by window) combined as "
                 f"independent variances: the ranking between them is not established; outside it, it is (at about "
                 f"95 %)." if ex.rank_noise else "")
        md = [f"# Leaderboard — {ex_id}: {ex.title}", "",
              f"Ranked by {ex.rank_by} (lower is better) among the submissions within budget; the others follow, "
              f"unranked.{noise}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        md += ["| " + " | ".join(cell(row, k) if k != "rank" or row["rank"] else "—" for k in cols) + " |"
               for row in rows]
        _write_atomic(out / f"{stem}.md", "\n".join(md) + "\n")
