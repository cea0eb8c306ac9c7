"""Stage the course website's sources: ``docs/`` pages plus the committed notebooks, for Sphinx (``make book``).

``docs/conf.py`` calls :func:`stage` before Sphinx reads anything. It mirrors the repository's layout into
the Sphinx source folder (``build/book/src``), so the relative links the notebooks and pages already use
(``../exercises/01_….ipynb``, ``09_….ipynb``, ``../docs/grading.md``) resolve on the site as they do on GitHub:

    index.md                 docs/index.md, the landing page
    docs/*.md                every other page of docs/ (DESIGN.md, the internal design contract, is left out)
    notebooks/NN_*.ipynb     the lessons, as committed (never executed here), with a header linking their
                             exercises, and a note beside each explorer picture that it is live in Jupyter
    exercises/NN_*.ipynb     the exercise notebooks, read-only, with a download link and an Open-in-Colab link
    _raw/…                   the unmodified notebooks, for the download links (not pages)
    _generated/*.md          the lesson table and the table of contents, built from the notebooks found

Nothing is copied into ``docs/`` and nothing is written by hand from the notebooks: every lesson, title,
exercise count and Colab link comes from ``notebooks/``, ``exercises/`` and ``attn_course._colab`` at build
time (globs, not a list: a new lesson or a capstone exercise notebook is picked up as it is).
Files are written only when their content changes, so an unchanged page is not rebuilt.
"""
from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
COLAB_BADGE = "https://colab.research.google.com/assets/colab-badge.svg"
LOCAL_BADGE = "/_assets/colab-badge.svg"          # drawn in docs/_static: no image is fetched at view time
# the docs/ pages and their order in the navigation; any other docs/*.md page follows them (alphabetically)
GUIDE_ORDER = ("install", "exercises", "grading", "api", "sources", "about", "publishing")
NOT_ON_THE_SITE = {"DESIGN.md"}                   # the design contract: a copy of the maintainers' document
LIVE_NOTE = ("```{admonition} Live in Jupyter\n:class: explorer-note\n"
             "This explorer is an interactive widget. Open the lesson in Jupyter (`make lab`) or in Colab and run "
             "the cell to use its controls; below is a picture of its first state.\n```")
MATHJAX_FILES = ("tex-chtml.js", "input/tex/extensions", "output/chtml/fonts/woff-v2", "ui", "a11y")


@dataclass(frozen=True)
class Lesson:
    number: str              # "01"
    title: str               # "Scaled dot-product attention"
    notebook: str | None     # "notebooks/01_….ipynb" (None: an exercise notebook without a lesson, e.g. a capstone)
    exercises: str | None    # "exercises/01_….ipynb"
    exercise_count: int


def _source(cell) -> str:
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else s


def _read(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def title_of(nb: dict, fallback: str) -> str:
    """The first ``# heading`` of the notebook without its ``Lesson NN —`` / ``Exercises NN —`` prefix."""
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "markdown":
            m = re.search(r"^#\s+(.+?)\s*$", _source(cell), re.M)
            if m:
                return re.sub(r"^(Lesson|Exercises|Capstone)\s+\d+\s*[—–:-]\s*", "", m.group(1)).strip()
    return fallback


def exercise_count(nb: dict) -> int:
    """Exercises in a notebook: its nbgrader solution cells (as README's lesson table counts them)."""
    return sum(bool(c.get("metadata", {}).get("nbgrader", {}).get("solution")) for c in nb.get("cells", []))


def lessons(root: Path = ROOT) -> list[Lesson]:
    """Every lesson of ``notebooks/`` and every exercise notebook of ``exercises/``, by number."""
    found: dict[str, dict] = {}
    for folder in ("notebooks", "exercises"):
        for path in sorted((root / folder).glob("[0-9][0-9]_*.ipynb")):
            found.setdefault(path.name[:2], {})[folder] = path
    out = []
    for number, paths in sorted(found.items()):
        lesson, ex = paths.get("notebooks"), paths.get("exercises")
        main = lesson or ex
        nb_ex = _read(ex) if ex else {}
        out.append(Lesson(number, title_of(_read(main), main.stem[3:].replace("_", " ")),
                          f"notebooks/{lesson.name}" if lesson else None,
                          f"exercises/{ex.name}" if ex else None, exercise_count(nb_ex)))
    return out


def _colab():
    from attn_course import _colab                         # the one place naming the repository
    return _colab


def _download(path: str) -> str:
    """A MyST download link for the unmodified notebook ``path`` (relative to the repository root)."""
    return f"{{download}}`download the notebook </_raw/{path}>`"


def _insert_after_badge(source: str, block: str) -> str:
    """``source`` of a first markdown cell with ``block`` after its Colab badge line (else after the title)."""
    lines = source.split("\n")
    at = next((i for i, l in enumerate(lines) if l.startswith("[![Open In Colab]")), 0)
    return "\n".join(lines[:at + 1] + ["", block, ""] + lines[at + 1:])


def stage_lesson(nb: dict, lesson: Lesson) -> dict:
    """The site's copy of a lesson notebook: exercise links in its header, explorers as pictures with a note,
    no widget state (nothing would render it offline), the Colab badge image served locally."""
    colab = _colab()
    out = copy.deepcopy(nb)
    header = [f"**On this site:** {_download(lesson.notebook)} · run it locally with `make lab`."]
    if lesson.exercises:
        header.append(f"**Exercises:** [{lesson.exercise_count} exercises, read-only](../{lesson.exercises}) · "
                      f"{_download(lesson.exercises)} · [open them in Colab]({colab.colab_url(lesson.exercises)})")
    _stage_cells(out, "\n".join(f"- {h}" for h in header))
    if lesson.exercises:                                   # prev/next: lesson NN, then its exercises, then NN+1
        out["cells"].append({"cell_type": "markdown", "metadata": {}, "id": "site-exercises-toctree",
                             "source": f"```{{toctree}}\n:hidden:\n\n../{lesson.exercises[:-6]}\n```"})
    return out


def stage_exercises(nb: dict, lesson: Lesson) -> dict:
    """The site's copy of an exercise notebook: read-only, with a download link and an Open-in-Colab link."""
    colab = _colab()
    out = copy.deepcopy(nb)
    back = f" for [lesson {lesson.number}](../{lesson.notebook})" if lesson.notebook else ""
    block = ("```{admonition} Read-only\n:class: exercises-note\n"
             f"This page shows the exercise notebook{back}; its `check(...)` cells give feedback only when the "
             f"notebook runs. To work on it: {_download(lesson.exercises)} and open it in Jupyter (`make lab`), or "
             f"[open it in Colab]({colab.colab_url(lesson.exercises)}).\n```")
    _stage_cells(out, block)
    return out


def _stage_cells(nb: dict, header: str) -> None:
    nb.get("metadata", {}).pop("widgets", None)
    first = next((c for c in nb["cells"] if c.get("cell_type") == "markdown"), None)
    if first is not None:
        first["source"] = _insert_after_badge(_source(first), header)
    for cell in nb["cells"]:
        if cell.get("cell_type") == "markdown":
            cell["source"] = _source(cell).replace(COLAB_BADGE, LOCAL_BADGE).replace("](../README.md)", "](../index.md)")
        outputs = []
        for o in cell.get("outputs", []):
            data = o.get("data", {})
            if WIDGET_VIEW in data:
                data.pop(WIDGET_VIEW)
                if "image/png" in data:                     # an explorer: its saved first state
                    outputs.append({"output_type": "display_data", "metadata": {},
                                    "data": {"text/markdown": LIVE_NOTE}})
            outputs.append(o)
        if "outputs" in cell:
            cell["outputs"] = outputs


def lesson_table(items: list[Lesson], root: Path = ROOT) -> str:
    """The landing page's lesson table and the course's table of contents (MyST)."""
    colab = _colab()
    descriptions = _readme_descriptions(root)
    rows = ["| # | lesson | what you build and measure | exercises | Colab |", "|---|---|---|---|---|"]
    for l in items:
        page = f"[{l.title}]({l.notebook})" if l.notebook else f"{l.title} (exercises only)"
        ex = f"[{l.exercise_count} exercises]({l.exercises})" if l.exercises else "—"
        links = " · ".join(f"[{what}]({colab.colab_url(p)})" for what, p in
                           (("lesson", l.notebook), ("exercises", l.exercises)) if p)
        rows.append(f"| {l.number} | {page} | {descriptions.get(l.number, '')} | {ex} | {links} |")
    toc = [l.notebook[:-6] if l.notebook else l.exercises[:-6] for l in items]
    return ("\n".join(rows) + "\n\n```{toctree}\n:caption: Lessons\n:hidden:\n\n" + "\n".join(toc) + "\n```\n")


def _readme_descriptions(root: Path = ROOT) -> dict[str, str]:
    """The README lesson table's "what you build and measure" column, by lesson number."""
    readme = root / "README.md"
    if not readme.exists():
        return {}
    row = re.compile(r"^\| (\d\d) \| \[[^\]]+\]\(notebooks/[^)]+\) \| (.*?) \| .*\|\s*$")
    return {m.group(1): m.group(2) for m in map(row.match, readme.read_text(encoding="utf-8").splitlines()) if m}


def clone_block() -> str:
    """The commands that run the course locally, for the repository ``attn_course._colab`` names."""
    repo = _colab().REPOSITORY
    return (f"```bash\ngit clone https://github.com/{repo}.git && cd {repo.split('/')[1]}\n"
            "make lab     # creates .venv, installs the course and JupyterLab, serves it\n```\n")


def guides(root: Path = ROOT) -> list[str]:
    """The docs/ pages of the site besides the landing page, in navigation order (stems)."""
    stems = [p.stem for p in sorted((root / "docs").glob("*.md")) if p.name not in NOT_ON_THE_SITE and p.stem != "index"]
    return sorted(stems, key=lambda s: (GUIDE_ORDER.index(s) if s in GUIDE_ORDER else len(GUIDE_ORDER), s))


def guide_toctree(stems: list[str]) -> str:
    return "```{toctree}\n:caption: Guides and reference\n:hidden:\n\n" + "\n".join(f"docs/{s}" for s in stems) + "\n```\n"


def guide_list(root: Path, stems: list[str]) -> str:
    """A bullet list linking each guide page by its title (its first heading)."""
    items = []
    for s in stems:
        m = re.search(r"^#\s+(.+?)\s*$", (root / "docs" / f"{s}.md").read_text(encoding="utf-8"), re.M)
        items.append(f"- [{m.group(1) if m else s}](docs/{s}.md)")
    return "\n".join(items) + "\n"


def _write(path: Path, text: str | bytes, written: set[Path]) -> None:
    """Write only when the content differs (Sphinx then rebuilds only what changed)."""
    written.add(path)
    data = text.encode("utf-8") if isinstance(text, str) else text
    if path.exists() and path.read_bytes() == data:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def mathjax_source() -> Path:
    """MathJax 3's browser bundle (``es5/``) from the pip package ``django-static-mathjax`` (the ``[book]`` extra):
    a vendored renderer, so the site typesets its math without a CDN."""
    import mathjax                                         # django-static-mathjax: static files, no Django needed
    es5 = Path(mathjax.__file__).parent / "static" / "mathjax" / "es5"
    if not (es5 / "tex-chtml.js").is_file():
        raise FileNotFoundError(f"MathJax's tex-chtml.js not found under {es5}: pip install django-static-mathjax")
    return es5


def stage(dest: Path, root: Path = ROOT) -> list[Lesson]:
    """Stage the site's sources into ``dest`` (see the module docstring); remove anything stale there."""
    dest = Path(dest).resolve()
    if (root / "build").resolve() not in dest.parents:          # it deletes what it did not write there
        raise ValueError(f"refusing to stage the site into {dest}: use a folder under {root / 'build'}")
    items = lessons(root)
    written: set[Path] = set()
    for page in sorted((root / "docs").glob("*.md")):
        if page.name in NOT_ON_THE_SITE:
            continue
        target = dest / "index.md" if page.stem == "index" else dest / "docs" / page.name
        _write(target, page.read_bytes(), written)
    stems = guides(root)
    _write(dest / "_generated" / "lessons.md", lesson_table(items, root), written)
    _write(dest / "_generated" / "clone.md", clone_block(), written)
    _write(dest / "_generated" / "guides.md", guide_toctree(stems), written)
    _write(dest / "_generated" / "guide_list.md", guide_list(root, stems), written)
    for l in items:
        for path, fn in ((l.notebook, stage_lesson), (l.exercises, stage_exercises)):
            if path is None:
                continue
            raw = (root / path).read_bytes()
            _write(dest / "_raw" / path, raw, written)
            _write(dest / path, json.dumps(fn(json.loads(raw), l), indent=1, ensure_ascii=False) + "\n", written)
    _write(dest / LOCAL_BADGE.lstrip("/"), (root / "docs" / "_static" / "colab-badge.svg").read_bytes(), written)
    es5 = mathjax_source()
    for part in MATHJAX_FILES:
        src = es5 / part
        for f in ([src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file())):
            _write(dest / "_mathjax" / "mathjax" / f.relative_to(es5), f.read_bytes(), written)
    for f in sorted(dest.rglob("*"), reverse=True):        # stale files (a renamed lesson), then empty folders
        if f.is_file() and f not in written:
            f.unlink()
        elif f.is_dir() and not any(f.iterdir()):
            f.rmdir()
    return items
