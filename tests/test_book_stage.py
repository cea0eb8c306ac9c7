"""The website's staging (docs/book.py, run by docs/conf.py when `make book` starts): what reaches Sphinx.

Checked on a small course made here (so each rule is seen to act) and on the real one: pages found by glob,
explorers turned into pictures with a note and no widget state, every Colab link from attn_course._colab,
downloads of the unmodified notebooks, an optional sources page, a capstone without a lesson, stale files
removed, unchanged files not rewritten. The browser test of the built site is tests/browser/test_book.py.
"""
from __future__ import annotations

import importlib.util
import json
import os
import pkgutil
import re
import shutil
import sys
from pathlib import Path

import pytest

import attn_course
from attn_course import _colab

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("course_book", ROOT / "docs" / "book.py")
book = importlib.util.module_from_spec(_spec)
sys.modules["course_book"] = book                  # (dataclasses look their module up while it loads)
_spec.loader.exec_module(book)

WIDGET = book.WIDGET_VIEW
BADGE = "[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://example.org)"


def _nb(cells, widgets=True):
    meta = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    if widgets:
        meta["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    return {"cells": cells, "metadata": meta, "nbformat": 4, "nbformat_minor": 5}


def _md(src):
    return {"cell_type": "markdown", "metadata": {}, "source": src}


def _code(src, outputs=()):
    return {"cell_type": "code", "metadata": {}, "source": src, "outputs": list(outputs), "execution_count": 1}


def _out(data):
    return {"output_type": "display_data", "metadata": {}, "data": data}


EXPLORER = _out({WIDGET: {"model_id": "x"}, "image/png": "iVBORw0KGgo=", "text/plain": "Interactive explorer"})
PROGRESS = _out({WIDGET: {"model_id": "y"}, "text/plain": "reversal: 150 training steps"})


def _course(tmp_path, *, sources=True, capstone=False) -> Path:
    """A course checkout in miniature: two lessons, their exercises, docs/ with or without sources.md."""
    root = tmp_path / "course"
    (root / "docs" / "_static").mkdir(parents=True)
    for name in ("index.md", "grading.md", "exercises.md", "api.md", "about.md", "DESIGN.md"):
        (root / "docs" / name).write_text(f"# {name[:-3].title()} page\n")
    shutil.copy(ROOT / "docs" / "_static" / "colab-badge.svg", root / "docs" / "_static")
    if sources:
        (root / "docs" / "sources.md").write_text("# Sources\n")
    (root / "README.md").write_text("| 01 | [A](notebooks/01_a.ipynb) | what lesson one builds | ✅ |\n")
    for folder in ("notebooks", "exercises"):
        (root / folder).mkdir()
    lesson = _nb([_md(f"# Lesson 01 — Attention A\n\n{BADGE}\n\nIntro, see [home](../README.md)."),
                  _code("train()", [PROGRESS]), _code("explorer.widget()", [EXPLORER])])
    (root / "notebooks" / "01_a.ipynb").write_text(json.dumps(lesson))
    (root / "notebooks" / "02_b.ipynb").write_text(json.dumps(_nb([_md("# Lesson 02 — B\n\nText.")], widgets=False)))
    ex = _nb([_md(f"# Exercises 01 — Attention A\n\n{BADGE}\n\nPractice."),
              {**_code("raise NotImplementedError"), "metadata": {"nbgrader": {"solution": True}}},
              {**_code("raise NotImplementedError"), "metadata": {"nbgrader": {"solution": True}}}], widgets=False)
    (root / "exercises" / "01_a.ipynb").write_text(json.dumps(ex))
    if capstone:
        (root / "exercises" / "16_capstone.ipynb").write_text(json.dumps(
            _nb([_md("# Capstone 16 — Design your own"), {**_code("pass"), "metadata": {"nbgrader": {"solution": True}}}],
                widgets=False)))
    return root


def _staged(dest: Path, path: str) -> dict:
    return json.loads((dest / path).read_text())


def _text(nb: dict) -> str:
    return "\n".join("".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in nb["cells"])


def test_lessons_and_exercises_are_found_by_glob_with_titles_and_counts(tmp_path):
    root = _course(tmp_path, capstone=True)
    items = book.lessons(root)
    assert [(i.number, i.title, i.notebook, i.exercises, i.exercise_count) for i in items] == [
        ("01", "Attention A", "notebooks/01_a.ipynb", "exercises/01_a.ipynb", 2),
        ("02", "B", "notebooks/02_b.ipynb", None, 0),
        ("16", "Design your own", None, "exercises/16_capstone.ipynb", 1)]


def test_explorers_become_pictures_with_a_live_note_and_no_widget_state(tmp_path):
    root = _course(tmp_path)
    dest = root / "build" / "book" / "src"
    book.stage(dest, root)
    nb = _staged(dest, "notebooks/01_a.ipynb")
    assert "widgets" not in nb["metadata"]
    assert not any(WIDGET in o.get("data", {}) for c in nb["cells"] for o in c.get("outputs", []))
    progress, explorer = nb["cells"][1]["outputs"], nb["cells"][2]["outputs"]
    assert progress == [_out({"text/plain": "reversal: 150 training steps"})]     # a progress bar: its text, no note
    assert len(explorer) == 2 and explorer[0]["data"] == {"text/markdown": book.LIVE_NOTE}
    assert explorer[1]["data"]["image/png"] == "iVBORw0KGgo="
    assert ":class: explorer-note" in book.LIVE_NOTE and "Jupyter" in book.LIVE_NOTE
    # the committed notebook itself is untouched, and served for download as it is
    assert (dest / "_raw" / "notebooks" / "01_a.ipynb").read_bytes() == (root / "notebooks" / "01_a.ipynb").read_bytes()


def test_lesson_and_exercise_headers_link_exercises_downloads_and_colab(tmp_path):
    root = _course(tmp_path)
    dest = root / "build" / "book" / "src"
    book.stage(dest, root)
    lesson = _text(_staged(dest, "notebooks/01_a.ipynb"))
    first = lesson.split("\n\n")
    assert first[0] == "# Lesson 01 — Attention A" and first[1].startswith("[![Open In Colab](/_assets/colab-badge.svg)")
    assert "[2 exercises, read-only](../exercises/01_a.ipynb)" in first[2]
    assert "{download}`download the notebook </_raw/notebooks/01_a.ipynb>`" in first[2]
    assert "{download}`download the notebook </_raw/exercises/01_a.ipynb>`" in first[2]
    assert f"[open them in Colab]({_colab.colab_url('exercises/01_a.ipynb')})" in first[2]
    assert "colab.research.google.com/assets" not in lesson                  # the badge image is served locally
    assert "](../index.md)" in lesson and "README.md" not in lesson           # the README's role: the landing page
    assert lesson.rstrip().endswith("```{toctree}\n:hidden:\n\n../exercises/01_a\n```")   # next: its exercises
    ex = _text(_staged(dest, "exercises/01_a.ipynb"))
    assert "```{admonition} Read-only" in ex and "[lesson 01](../notebooks/01_a.ipynb)" in ex
    assert f"[open it in Colab]({_colab.colab_url('exercises/01_a.ipynb')})" in ex
    assert "</_raw/exercises/01_a.ipynb>" in ex
    lesson2 = _text(_staged(dest, "notebooks/02_b.ipynb"))                   # no exercises: no exercise links
    assert "Exercises:" not in lesson2 and "toctree" not in lesson2


def test_landing_page_table_toc_and_guides(tmp_path):
    root = _course(tmp_path, sources=False, capstone=True)
    dest = root / "build" / "book" / "src"
    book.stage(dest, root)
    table = (dest / "_generated" / "lessons.md").read_text()
    assert "| 01 | [Attention A](notebooks/01_a.ipynb) | what lesson one builds | [2 exercises](exercises/01_a.ipynb) |" in table
    assert f"[lesson]({_colab.colab_url('notebooks/01_a.ipynb')}) · [exercises]({_colab.colab_url('exercises/01_a.ipynb')})" in table
    assert "| 16 | Design your own (exercises only) |" in table
    assert table.split("```{toctree}")[1].split("\n\n")[1].split("\n")[:3] == [
        "notebooks/01_a", "notebooks/02_b", "exercises/16_capstone"]
    guides = (dest / "_generated" / "guides.md").read_text()
    assert guides.split("\n\n")[1].split("\n")[:4] == ["docs/exercises", "docs/grading", "docs/api", "docs/about"]
    assert "sources" not in guides and "DESIGN" not in guides and not (dest / "docs" / "DESIGN.md").exists()
    assert (dest / "index.md").read_text() == "# Index page\n"
    assert f"https://github.com/{_colab.REPOSITORY}.git" in (dest / "_generated" / "clone.md").read_text()
    # with a sources page: it is staged and listed (after the API reference), by its title
    (root / "docs" / "sources.md").write_text("# Sources\n")
    book.stage(dest, root)
    assert "docs/api\ndocs/sources\ndocs/about" in (dest / "_generated" / "guides.md").read_text()
    assert "- [Sources](docs/sources.md)" in (dest / "_generated" / "guide_list.md").read_text()


def test_restaging_removes_stale_files_and_leaves_unchanged_ones_alone(tmp_path):
    root = _course(tmp_path)
    dest = root / "build" / "book" / "src"
    book.stage(dest, root)
    assert (dest / "_mathjax" / "mathjax" / "tex-chtml.js").is_file()                 # the vendored renderer
    assert list((dest / "_mathjax" / "mathjax" / "output" / "chtml" / "fonts" / "woff-v2").glob("*.woff"))
    page = dest / "notebooks" / "02_b.ipynb"
    os.utime(page, (1_000_000, 1_000_000))
    (root / "notebooks" / "01_a.ipynb").rename(root / "notebooks" / "01_renamed.ipynb")
    book.stage(dest, root)
    assert page.stat().st_mtime == 1_000_000                                           # not rewritten
    assert not (dest / "notebooks" / "01_a.ipynb").exists() and (dest / "notebooks" / "01_renamed.ipynb").exists()
    assert not (dest / "_raw" / "notebooks" / "01_a.ipynb").exists()


@pytest.mark.parametrize("where", ["", "docs", "notebooks", "../elsewhere"])
def test_staging_refuses_a_folder_outside_build(tmp_path, where):
    root = _course(tmp_path)
    with pytest.raises(ValueError, match="refusing"):
        book.stage(root / where, root)


def test_the_real_course_stages_every_notebook(tmp_path):
    items = book.lessons(ROOT)
    lessons = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    exercises = sorted(p.name for p in (ROOT / "exercises").glob("[0-9][0-9]_*.ipynb"))
    assert [i.notebook for i in items if i.notebook] == [f"notebooks/{n}" for n in lessons]
    assert [i.exercises for i in items if i.exercises] == [f"exercises/{n}" for n in exercises]
    for i in items:
        assert i.title and not re.match(r"(Lesson|Exercises)\b", i.title), i


def _public_modules() -> list[str]:
    out = []
    for m in pkgutil.walk_packages(attn_course.__path__, "attn_course."):
        parts = m.name.split(".")
        if any(p.startswith("_") for p in parts[1:]):
            continue                                       # private
        if re.fullmatch(r"attn_course\.grading\.exercises\.lesson\d\d", m.name):
            continue                                       # the exercises themselves: in the exercise notebooks
        out.append(m.name)
    return out


def test_the_api_reference_documents_every_public_module():
    documented = re.findall(r"^\.\. automodule:: (\S+)$", (ROOT / "docs" / "api.md").read_text(), re.M)
    assert len(documented) == len(set(documented)), "a module documented twice"
    missing = sorted(set(_public_modules()) - set(documented))
    assert not missing, f"docs/api.md lacks {missing}"


def test_the_pages_workflow_publishes_make_book_from_main():
    wf = (ROOT / ".github" / "workflows" / "pages.yml").read_text()
    make = (ROOT / "Makefile").read_text()
    out = re.search(r"^BOOK\s*:=\s*(\S+)\s*$", make, re.M).group(1)
    assert re.search(r"^on:\n  push:\n    branches: \[main\]", wf, re.M), "published from main"
    assert re.search(r"^\s+run: make book\b", wf, re.M)
    assert re.search(rf"^\s+path: {re.escape(out)}\s*$", wf, re.M), f"uploads {out}, where make book writes"
    assert "actions/deploy-pages@" in wf and "pages: write" in wf and "id-token: write" in wf
    assert "$(BIN)/sphinx-build -W --keep-going" in make                     # warnings are errors
