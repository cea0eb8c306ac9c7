"""``attn-course release [--check]``: build ``exercises/NN_*.ipynb`` from ``solutions/NN_*.ipynb``.

In each exercise cell every solution region (``### BEGIN SOLUTION`` … ``### END SOLUTION``) becomes
``raise NotImplementedError("Exercise <id>: your code here")`` at the region's indentation; the exercise
cell and its ``check(...)`` cell lose their outputs and execution counts. Everything else (prose, figures,
metadata, the nbgrader metadata of the exercise cells) is kept as it is. The JSON is written by
``nbformat`` and is therefore deterministic, so ``--check`` compares file contents exactly.

It writes the nbgrader metadata of ``solutions/`` from the exercise registry, where each exercise's points
are defined once (``Exercise.points`` in ``attn_course/grading/exercises/lessonNN.py``): the exercise cell
(``solution: true, grade: false``, its ``grade_id`` and points) and its ``check("<id>", obj)`` cell, a
locked nbgrader autograder-test cell (``grade: true, locked: true, solution: false, points,
grade_id: "<id>_test"``) whose value — the score ``check()`` returns — is the partial credit nbgrader
records. ``--check`` reports every cell whose metadata disagrees (see :func:`grading_problems`).

Solution-only text never reaches ``exercises/``: a cell tagged ``solution-only`` (its ``metadata.tags``) is
dropped with its outputs, and a markdown region between the lines ``<!-- BEGIN SOLUTION -->`` and
``<!-- END SOLUTION -->`` is removed with its markers (e.g. the course's own answer to an open exercise, written
under the learner's "explain your design" prompt). :func:`leaks` then checks the released notebook against every
solution-only line (solution regions, solution-only cells and regions, the outputs the release clears); a leak
fails ``release`` and ``release --check``.
It also stamps the Colab install source (:mod:`attn_course._colab`, the one place naming the repository
and the ``v<version>`` tag) into the setup cell of every notebook in ``notebooks/``, ``solutions/`` and
``exercises/``, and an "Open in Colab" badge for that notebook into its first markdown cell; ``--check``
reports a notebook whose stamp is stale. The README's badge line and its link to the course website (if it has
them) are re-stamped too (:func:`attn_course._colab.site_url`).
"""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import nbformat

from . import notebook as nbk

__all__ = ["find_root", "release_notebook", "leaks", "SOLUTION_ONLY_TAG", "MD_BEGIN", "MD_END", "stamp_notebook", "stamp_grading", "grading_problems",
           "test_cell_metadata", "exercise_cell_metadata", "render", "release", "lint"]

SETUP_MARKER = 'find_spec("attn_course")'
README_BADGE_TARGET = "notebooks/01_scaled_dot_product_attention.ipynb"
STAMPED_FOLDERS = ("notebooks", "solutions")
SOLUTION_ONLY_TAG = "solution-only"             # a cell with this tag is not released (nor its outputs)
MD_BEGIN, MD_END = "<!-- BEGIN SOLUTION -->", "<!-- END SOLUTION -->"    # a markdown region that is not released
LEAK_MIN_CHARS = 16                             # shorter solution-only lines are too generic to call a leak    # stamped in place; exercises/ is stamped when generated


def find_root(start: str | Path | None = None) -> Path:
    """The course checkout: the first directory upwards from ``start`` (default: cwd) holding
    ``solutions/``; else the directory above the installed package (an editable install)."""
    here = Path(start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / "solutions").is_dir():
            return d
    return Path(__file__).resolve().parents[2]


def _solution_only(cell) -> bool:
    return SOLUTION_ONLY_TAG in (cell.metadata.get("tags") or [])


def _md_regions(src: str) -> list[tuple[int, int]]:
    """(first, last) line indices of each ``<!-- BEGIN SOLUTION -->`` … ``<!-- END SOLUTION -->`` region, markers
    included; an unclosed region runs to the cell's end (never released by mistake)."""
    regions, start = [], None
    lines = src.split("\n")
    for i, line in enumerate(lines):
        if line.strip() == MD_BEGIN and start is None:
            start = i
        elif line.strip() == MD_END and start is not None:
            regions.append((start, i))
            start = None
    if start is not None:
        regions.append((start, len(lines) - 1))
    return regions


def _strip_md_regions(src: str) -> str:
    lines, keep = src.split("\n"), []
    drop = {i for a, b in _md_regions(src) for i in range(a, b + 1)}
    keep = [line for i, line in enumerate(lines) if i not in drop]
    text = "\n".join(keep)
    while "\n\n\n" in text:                                   # the blank lines around a removed region
        text = text.replace("\n\n\n", "\n\n")
    return text.strip("\n")


def release_notebook(nb) -> nbformat.NotebookNode:
    """The learner's version of a solutions notebook (a new object; ``nb`` is not modified)."""
    out = copy.deepcopy(nb)
    out.cells = [c for c in out.cells if not _solution_only(c)]
    for cell in out.cells:
        if cell.cell_type == "markdown" and _md_regions(nbk.source_of(cell)):
            cell.source = _strip_md_regions(nbk.source_of(cell))
    ids = set()
    for cell in out.cells:
        gid = nbk.grade_id(cell)
        src = nbk.source_of(cell)
        if gid is not None:
            ids.add(gid)
            cell.metadata["deletable"] = False          # as nbgrader's release: the grader finds answers by this cell
            cell.source = nbk.stub_source(src, gid)
            cell.outputs = []
            cell.execution_count = None
        elif cell.cell_type != "code" and nbk.BEGIN in src:        # nbgrader-style written answer
            cell.source = _markdown_stub(src)
    for cell in out.cells:
        if cell.cell_type == "code" and nbk.grade_id(cell) is None:
            if any(step[0] == "capture" and step[1] in ids for step in nbk.split_checks(nbk.source_of(cell))):
                cell.outputs = []
                cell.execution_count = None
    return out


def _output_text(cell) -> str:
    parts = []
    for o in cell.get("outputs", []) if cell.cell_type == "code" else []:
        for v in ([o.get("text", "")] + [o.get("data", {}).get(k, "") for k in ("text/plain", "text/html",
                                                                                "text/markdown")]):
            parts.append(v if isinstance(v, str) else "".join(v))
    return "\n".join(parts)


def _lines(text: str) -> set[str]:
    """The stripped lines of ``text`` long enough to be specific (:data:`LEAK_MIN_CHARS`)."""
    return {line.strip() for line in text.split("\n") if len(line.strip()) >= LEAK_MIN_CHARS}


def leaks(solution, released) -> list[str]:
    """Solution-only lines of ``solution`` that ``released`` still holds (in a cell's source or outputs): the
    lines of every solution region, of solution-only cells and markdown regions, and the outputs of the cells
    whose outputs the release clears (exercise and check cells) — each line of at least
    :data:`LEAK_MIN_CHARS` characters that appears nowhere else in ``solution`` (not even inside a longer line) —
    and every malformed solution marker in a markdown cell (a region it fails to open or close would be
    released). Empty when nothing leaks."""
    public, secret = [], []
    for cell in solution.cells:
        src = nbk.source_of(cell)
        if _solution_only(cell):
            secret += [src, _output_text(cell)]
            continue
        lines = src.split("\n")
        if nbk.grade_id(cell) is not None:
            try:
                regions = [(a, b) for a, b, _ in nbk.solution_regions(src)]
            except ValueError:
                regions = [(0, len(lines) - 1)]
            secret.append(_output_text(cell))
        elif cell.cell_type == "markdown":
            regions = _md_regions(src)
            if nbk.BEGIN in src:                                # nbgrader-style written answer
                try:
                    regions += [(a, b) for a, b, _ in nbk.solution_regions(src)]
                except ValueError:
                    regions += [(0, len(lines) - 1)]
        else:
            regions = []
            is_check = any(step[0] == "capture" for step in nbk.split_checks(src))
            (secret if is_check else public).append(_output_text(cell))
        inside = {i for a, b in regions for i in range(a, b + 1)}
        secret.append("\n".join(line for i, line in enumerate(lines) if i in inside))
        public.append("\n".join(line for i, line in enumerate(lines) if i not in inside))
    problems = [f"malformed solution marker {line.strip()!r} (write {MD_BEGIN} / {MD_END} on lines of their own)"
                for c in solution.cells if c.cell_type == "markdown" for line in nbk.source_of(c).split("\n")
                if "<!--" in line and "SOLUTION" in line.upper() and line.strip() not in (MD_BEGIN, MD_END)]
    known = "\n".join(public)                               # e.g. a line the prompt quotes is no secret
    shown = "\n".join(nbk.source_of(c) + "\n" + _output_text(c) for c in released.cells)
    return problems + sorted(line for line in set().union(*map(_lines, secret)) if line in shown and line not in known)


def stamp_notebook(nb, path: str) -> nbformat.NotebookNode:
    """A copy of ``nb`` with the Colab stamp for ``path`` (relative to the repository root): the setup
    cell (the first code cell containing ``find_spec("attn_course")``) installs
    :func:`attn_course._colab.install_spec`, and the first markdown cell carries
    :func:`attn_course._colab.badge_markdown` for ``path``. A notebook without a setup cell is returned
    unchanged (nothing there would install the package)."""
    from .. import _colab
    out = copy.deepcopy(nb)
    setup = next((c for c in out.cells if c.cell_type == "code" and SETUP_MARKER in nbk.source_of(c)), None)
    if setup is None:
        return out
    setup.source = _colab.stamp_setup_source(nbk.source_of(setup))
    first_md = next((c for c in out.cells if c.cell_type == "markdown"), None)
    if first_md is not None:
        first_md.source = _colab.stamp_badge_source(nbk.source_of(first_md), path)
    for cell in out.cells:                                          # links to other notebooks, also in Colab
        if cell.cell_type == "markdown":
            cell.source = _colab.stamp_colab_links(nbk.source_of(cell), path)
    return out


def exercise_cell_metadata(exercise_id: str, points: float) -> dict:
    """nbgrader metadata of an exercise cell: a solution cell (nbgrader ignores its points; they are kept
    for readers, equal to the test cell's)."""
    return {"grade": False, "grade_id": exercise_id, "locked": False, "points": _number(points),
            "schema_version": 3, "solution": True, "task": False}


def test_cell_metadata(exercise_id: str, points: float) -> dict:
    """nbgrader metadata of the ``check("<id>", obj)`` cell: a locked autograder-test cell worth the
    exercise's points. nbgrader gives it the score the cell evaluates to (``check()``'s result)."""
    return {"grade": True, "grade_id": f"{exercise_id}_test", "locked": True, "points": _number(points),
            "schema_version": 3, "solution": False, "task": False}


def _number(points: float):
    return int(points) if float(points).is_integer() else float(points)


def _test_cells(nb):
    """``[(exercise ids, cell)]`` for every code cell holding a top-level ``check("<id>", ...)`` call that
    is not an exercise cell (whatever its metadata says, e.g. a check cell wrongly marked as a solution)."""
    from .exercises import registry
    reg = registry()
    found = []
    for cell in nb.cells:
        if cell.cell_type == "code" and nbk.grade_id(cell) not in reg:
            ids = [step[1] for step in nbk.split_checks(nbk.source_of(cell)) if step[0] == "capture"]
            if ids:
                found.append((ids, cell))
    return found


def grading_problems(nb, name: str = "") -> list[str]:
    """Where the nbgrader metadata of a solutions notebook disagrees with the registry: an exercise cell
    or a check cell whose points, grade_id or grade/locked/solution flags differ from
    :func:`exercise_cell_metadata` / :func:`test_cell_metadata`; a check cell that is not exactly one
    ``check("<id>", obj)`` statement (its value must be the score). Empty when :func:`stamp_grading`
    would change nothing."""
    from .exercises import registry
    reg = registry()
    problems = []

    def compare(cell, want, what):
        have = cell.metadata.get("nbgrader")
        if not isinstance(have, dict):
            problems.append(f"{name}: {what} has no nbgrader metadata (want {want})")
            return
        diff = [f"{k}={have.get(k)!r} (want {v!r})" for k, v in want.items() if have.get(k) != v
                or type(have.get(k)) is not type(v)]
        diff += [f"unexpected {k}={have[k]!r}" for k in have if k not in want]
        if diff:
            problems.append(f"{name}: {what}: " + ", ".join(diff))

    for gid, cell in nbk.exercise_cells(nb).items():
        if gid in reg:
            compare(cell, exercise_cell_metadata(gid, reg[gid].points), f"exercise cell {gid}")
    for ids, cell in _test_cells(nb):
        steps = nbk.split_checks(nbk.source_of(cell))
        if len(steps) != 1:
            problems.append(f"{name}: check cell of {', '.join(ids)}: must hold exactly one check(...) "
                            f"statement and nothing else (its value is the score nbgrader reads)")
            continue
        if ids[0] in reg:
            compare(cell, test_cell_metadata(ids[0], reg[ids[0]].points), f"check cell of {ids[0]}")
    return problems


def stamp_grading(nb) -> nbformat.NotebookNode:
    """A copy of ``nb`` whose exercise cells and check cells carry the nbgrader metadata the registry
    implies (:func:`exercise_cell_metadata`, :func:`test_cell_metadata`); other cells are unchanged."""
    from .exercises import registry
    reg = registry()
    out = copy.deepcopy(nb)
    for gid, cell in nbk.exercise_cells(out).items():
        if gid in reg:
            cell.metadata["nbgrader"] = exercise_cell_metadata(gid, reg[gid].points)
    for ids, cell in _test_cells(out):
        if len(ids) == 1 and len(nbk.split_checks(nbk.source_of(cell))) == 1 and ids[0] in reg:
            cell.metadata["nbgrader"] = test_cell_metadata(ids[0], reg[ids[0]].points)
    return out


def _markdown_stub(src: str) -> str:
    lines = src.split("\n")
    out, pos = [], 0
    for begin, end, indent in nbk.solution_regions(src):
        out += lines[pos:begin] + [indent + "YOUR ANSWER HERE"]
        pos = end + 1
    return "\n".join(out + lines[pos:])


def render(nb) -> str:
    text = nbformat.writes(nb, version=4)
    return text if text.endswith("\n") else text + "\n"


def lint(nb, name: str = "") -> list[str]:
    """Authoring problems of a solutions notebook: exercise ids unknown to the registry, points that
    differ from ``Exercise.points``, exercise cells without a solution region or without a ``check``
    cell, and solution regions at the top level of a cell (the released cell would raise when run)."""
    from .exercises import registry
    reg = registry()
    problems = []
    checked = {step[1] for cell in nb.cells if cell.cell_type == "code"
               for step in nbk.split_checks(nbk.source_of(cell)) if step[0] == "capture"}
    for gid, cell in nbk.exercise_cells(nb).items():
        where = f"{name}: exercise {gid}"
        src = nbk.source_of(cell)
        try:
            regions = nbk.solution_regions(src)
        except ValueError as exc:
            problems.append(f"{where}: {exc}")
            continue
        if not regions:
            problems.append(f"{where}: no '{nbk.BEGIN}' region")
        if any(indent == "" for _, _, indent in regions):
            problems.append(f"{where}: a solution region at the top level of the cell; put it inside a "
                            f"function so the released notebook still runs")
        if gid not in reg:
            problems.append(f"{where}: no Exercise with this id in attn_course.grading.exercises")
        elif float(cell.metadata["nbgrader"].get("points", -1)) != float(reg[gid].points):
            problems.append(f"{where}: notebook says {cell.metadata['nbgrader'].get('points')} points, "
                            f"the Exercise says {reg[gid].points}")
        if gid not in checked:
            problems.append(f"{where}: no check(\"{gid}\", ...) cell")
    return problems


def exercise_table(stems: list[str]) -> str:
    """``docs/exercises.md``: every exercise of the registry by lesson, with its kind and points (Markdown)."""
    from .exercises import registry
    from .spec import KINDS
    by_lesson = {stem[:2]: stem for stem in stems}
    lines = ["# Exercises", "",
             "Generated by `attn-course release` from the exercise registry; do not edit by hand. "
             "Kinds: " + "; ".join(f"**{k}**" for k in KINDS) + " (see the grading guide).", "",
             "| lesson | exercise | kind | points | title |", "| --- | --- | --- | --- | --- |"]
    for ex in registry().values():
        stem = by_lesson.get(ex.id[:2], ex.id[:2])
        points = int(ex.points) if float(ex.points).is_integer() else ex.points
        lines.append(f"| {stem} | `{ex.id}` | {ex.kind} | {points} | {ex.title} |")
    return "\n".join(lines) + "\n"


def release(root: str | Path | None = None, *, check: bool = False, stream=None) -> int:
    """Stamp the Colab install source and badges (:func:`stamp_notebook`) and regenerate ``exercises/``
    (or, with ``check``, only compare). Returns the exit code: 1 when ``check`` finds a stale, missing or
    orphaned exercises notebook, solution-only text in a released notebook (:func:`leaks`), a stale Colab stamp (notebooks/, solutions/, README) or nbgrader
    metadata of ``solutions/`` that disagrees with the registry (:func:`grading_problems`), else 0. Authoring problems
    (see :func:`lint`) are printed as warnings."""
    stream = stream or sys.stdout
    root = Path(root) if root is not None else find_root()
    sol_dir, ex_dir = root / "solutions", root / "exercises"
    sources = sorted(sol_dir.glob("*.ipynb"))
    if not sources:                                                 # not a checkout: no false green
        print(f"attn-course release: no solutions/*.ipynb under {root}: run it from the course checkout "
              f"or pass --root /path/to/the/checkout", file=sys.stderr)
        return 2
    stale = []
    metadata_problems = []
    leaked: list[str] = []
    for folder in STAMPED_FOLDERS:                                  # the Colab stamp, in place
        for path in sorted((root / folder).glob("*.ipynb")):
            nb = nbk.read(path)
            if folder == "solutions":                               # nbgrader metadata from the registry
                metadata_problems += grading_problems(nb, f"{folder}/{path.name}")
                nb = stamp_grading(nb)
            text = render(stamp_notebook(nb, f"{folder}/{path.name}"))
            if path.read_text(encoding="utf-8") != text:
                stale.append(path)
                if not check:
                    path.write_text(text, encoding="utf-8")
    readme = root / "README.md"                                     # its badge opens lesson 01
    if readme.exists():
        from .. import _colab
        current = readme.read_text(encoding="utf-8")
        text = _colab.restamp_site_links(_colab.restamp_badges(current, README_BADGE_TARGET))
        if text != current:
            stale.append(readme)
            if not check:
                readme.write_text(text, encoding="utf-8")
    for path in sources:
        nb = stamp_notebook(stamp_grading(nbk.read(path)), f"solutions/{path.name}")
        for problem in lint(nb, path.name):
            print(f"warning: {problem}", file=sys.stderr)
        released = stamp_notebook(release_notebook(nb), f"exercises/{path.name}")
        text = render(released)
        target = ex_dir / path.name
        current = target.read_text(encoding="utf-8") if target.exists() else None
        shipped = released                                          # --check: the file as it is on disk
        if check and current is not None:
            try:
                shipped = nbformat.reads(current, as_version=4)
            except Exception:
                shipped = released
        leaked += [f"exercises/{path.name}: {line!r}" for line in leaks(nb, shipped)]
        if current == text:
            continue
        stale.append(target)
        if not check:
            ex_dir.mkdir(exist_ok=True)
            target.write_text(text, encoding="utf-8")
    table = root / "docs" / "exercises.md"                          # the exercise table, with each kind
    text = exercise_table([p.stem for p in sources])
    if (table.read_text(encoding="utf-8") if table.exists() else None) != text:
        stale.append(table)
        if not check:
            table.parent.mkdir(exist_ok=True)
            table.write_text(text, encoding="utf-8")
    orphans = sorted(p for p in ex_dir.glob("*.ipynb") if not (sol_dir / p.name).exists()) if ex_dir.is_dir() else []
    if check:
        for problem in metadata_problems:
            print(f"nbgrader metadata: {problem}", file=stream)
        for p in stale:
            what = ("exercise table" if p.name == "exercises.md" else
                    "exercises notebook" if p.parent == ex_dir else
                    "nbgrader metadata or Colab stamp" if p.parent == sol_dir else "Colab stamp")
            print(f"stale: {p.relative_to(root)} ({what}; run `attn-course release`)", file=stream)
        for p in orphans:
            print(f"orphan: {p.relative_to(root)} has no solutions/{p.name}", file=stream)
        for line in leaked:
            print(f"leak: {line} (solution-only text in the released notebook)", file=stream)
        if not stale and not orphans and not leaked:
            print(f"exercises/ is up to date ({len(sources)} notebooks)", file=stream)
        return 1 if stale or orphans or metadata_problems or leaked else 0
    for line in leaked:
        print(f"leak: {line} (solution-only text in the released notebook: mark it solution-only)", file=stream)
    for p in orphans:
        p.unlink()
        print(f"removed {p.relative_to(root)} (no solutions/{p.name})", file=stream)
    stamped = sum(p.parent != ex_dir and p != table for p in stale)
    print(f"released {len(sources)} notebooks into exercises/ ({len(stale) - stamped} changed); "
          f"Colab stamp updated in {stamped} notebooks", file=stream)
    return 1 if leaked else 0


RULES_TAG = "sandbox-rules"


def add_rules_box(nb) -> bool:
    """Insert (or update) the sandbox rules box (``grading/rules.md``) right after the notebook's first markdown
    cell, once; it is found again by its ``sandbox-rules`` tag. Returns True when the notebook changed."""
    text = (Path(__file__).with_name("rules.md")).read_text(encoding="utf-8").strip()
    found = [c for c in nb.cells if RULES_TAG in c.get("metadata", {}).get("tags", [])]
    if found:
        if found[0].source == text:
            return False
        found[0].source = text
        return True
    first = next((n for n, c in enumerate(nb.cells) if c.cell_type == "markdown"), -1)
    nb.cells.insert(first + 1, nbformat.v4.new_markdown_cell(text, metadata={"tags": [RULES_TAG]}))
    return True


def add_rules_boxes(paths) -> list[str]:
    """:func:`add_rules_box` on each exercise notebook in ``paths``; the names of those that changed.
    ``python -c "import glob; from attn_course.grading.release import add_rules_boxes;
    print(add_rules_boxes(sorted(glob.glob('solutions/*.ipynb'))))"``, then ``attn-course release``."""
    changed = []
    for path in map(Path, paths):
        nb = nbformat.read(str(path), as_version=4)
        if add_rules_box(nb):
            nbformat.write(nb, str(path))
            changed.append(path.name)
    return changed
