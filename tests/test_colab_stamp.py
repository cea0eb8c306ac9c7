"""The Colab install source is defined once (attn_course._colab) and `attn-course release` stamps it,
pinned to the package version, into every setup cell and an "Open in Colab" badge into every notebook's
first markdown cell; `release --check` fails on a stale stamp."""
import json
import posixpath
import re
import shutil
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

import attn_course
from attn_course import _colab
from attn_course.grading import notebook as nbk
from attn_course.grading.release import release, stamp_notebook

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("notebooks", "solutions", "exercises")
SETUP = '''import importlib.util, subprocess, sys
if importlib.util.find_spec("attn_course") is None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    "git+https://github.com/someone/old.git"], check=True)
import torch'''


def test_install_spec_and_badge_come_from_one_place_and_pin_the_version():
    spec = _colab.install_spec()
    assert spec == f"git+https://github.com/{_colab.REPOSITORY}.git@v{attn_course.__version__}"
    badge = _colab.badge_markdown("notebooks/01_x.ipynb")
    m = re.fullmatch(r"\[!\[Open In Colab\]\((\S+)\)\]\((\S+)\)", badge)
    assert m and m.group(1) == _colab.BADGE_IMAGE
    assert m.group(2) == (f"https://colab.research.google.com/github/{_colab.REPOSITORY}/blob/"
                          f"v{attn_course.__version__}/notebooks/01_x.ipynb")
    assert _colab.install_spec("9.9.9", "o/r") == "git+https://github.com/o/r.git@v9.9.9"


def test_stamp_setup_source_replaces_the_target_and_refuses_a_cell_without_one():
    out = _colab.stamp_setup_source(SETUP)
    assert f'"{_colab.install_spec()}"' in out and "someone/old" not in out
    # the install call raises a message that says what to do instead of pip's CalledProcessError (issue 33)
    call = _colab._install_call("    ", '"X"')
    assert out.replace(_colab.install_spec(), "X") == SETUP.replace(
        '    subprocess.run([sys.executable, "-m", "pip", "install", "-q",\n'
        '                    "git+https://github.com/someone/old.git"], check=True)\n', call + _colab._AFTER_INSTALL)
    assert _colab.stamp_setup_source(out) == out                       # idempotent
    with pytest.raises(ValueError, match="install target"):
        _colab.stamp_setup_source("import torch")


def test_stamp_badge_source_inserts_once_after_the_title_and_replaces_a_stale_badge():
    src = "# Lesson 09 — X\n\nIntro text."
    once = _colab.stamp_badge_source(src, "notebooks/09_x.ipynb")
    assert once == f"# Lesson 09 — X\n\n{_colab.badge_markdown('notebooks/09_x.ipynb')}\n\nIntro text."
    assert _colab.stamp_badge_source(once, "notebooks/09_x.ipynb") == once
    stale = once.replace(f"v{attn_course.__version__}", "v0.0.1")
    assert stale != once and _colab.stamp_badge_source(stale, "notebooks/09_x.ipynb") == once
    assert _colab.stamp_badge_source("# Title", "p.ipynb") == f"# Title\n\n{_colab.badge_markdown('p.ipynb')}\n"


def _lesson(title):
    return new_notebook(cells=[new_markdown_cell(f"# {title}\n\nText."), new_code_cell(SETUP),
                               new_code_cell("print(1)")])


def test_release_stamps_every_folder_and_check_detects_a_stale_stamp(tmp_path, capsys, monkeypatch):
    for folder in ("notebooks", "solutions"):
        (tmp_path / folder).mkdir()
        nbformat.write(_lesson("Lesson 01"), str(tmp_path / folder / "01_a.ipynb"))
    (tmp_path / "README.md").write_text(f"# Course\n\n{_colab.badge_markdown('elsewhere.ipynb', '0.0.1')}\n")
    assert release(tmp_path, check=True) == 1
    out = capsys.readouterr().out
    assert "stale: notebooks/01_a.ipynb (Colab stamp" in out and "stale: README.md" in out
    assert release(tmp_path) == 0 and release(tmp_path, check=True) == 0
    for folder in ("notebooks", "solutions", "exercises"):
        cells = nbformat.read(str(tmp_path / folder / "01_a.ipynb"), as_version=4).cells
        assert f'"{_colab.install_spec()}"' in cells[1].source
        assert _colab.badge_markdown(f"{folder}/01_a.ipynb") in cells[0].source
        assert cells[2].source == "print(1)"
    assert _colab.badge_markdown("notebooks/01_scaled_dot_product_attention.ipynb") in (tmp_path / "README.md").read_text()
    # a notebook stamped for an older version, or the repository moved: --check fails until re-released
    lesson = tmp_path / "notebooks" / "01_a.ipynb"
    lesson.write_text(lesson.read_text().replace(f"@v{attn_course.__version__}", "@v0.0.1"))
    assert release(tmp_path, check=True) == 1
    assert "stale: notebooks/01_a.ipynb" in capsys.readouterr().out
    assert release(tmp_path) == 0 and release(tmp_path, check=True) == 0
    monkeypatch.setattr(_colab, "REPOSITORY", "published-owner/attn_course")
    assert release(tmp_path, check=True) == 1
    assert release(tmp_path) == 0
    assert "published-owner/attn_course.git@v" in (tmp_path / "exercises" / "01_a.ipynb").read_text()


def test_a_notebook_without_setup_cell_is_left_alone():
    nb = new_notebook(cells=[new_markdown_cell("# T"), new_code_cell("x = 1")])
    assert stamp_notebook(nb, "notebooks/t.ipynb") == nb


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_course_notebook_carries_the_current_stamp(folder):
    paths = sorted((ROOT / folder).glob("*.ipynb"))
    assert paths
    for path in paths:
        cells = json.loads(path.read_text())["cells"]
        setup = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
        assert f'"{_colab.install_spec()}"' in setup[0], f"{path.name}: setup cell not stamped"
        first_md = "".join(next(c for c in cells if c["cell_type"] == "markdown")["source"])
        assert _colab.badge_markdown(f"{folder}/{path.name}") in first_md, f"{path.name}: no Colab badge"


def test_readme_badge_and_which_line_to_change():
    text = (ROOT / "README.md").read_text()
    assert _colab.badge_markdown("notebooks/01_scaled_dot_product_attention.ipynb") in text
    assert "attn_course/_colab.py" in text and "REPOSITORY" in text


def test_setup_cells_refresh_import_caches_and_say_when_to_restart():
    """N-20: after pip installs the course in Colab the kernel refreshes its import caches, and the cell says
    that a runtime restart is needed if pip upgraded a package the runtime had already imported."""
    for path in sorted(ROOT.glob("*/[0-9][0-9]_*.ipynb")):
        setup = [nbk.source_of(c) for c in nbk.read(path).cells
                 if c.cell_type == "code" and 'find_spec("attn_course")' in nbk.source_of(c)]
        assert setup and _colab._AFTER_INSTALL in setup[0], path.name
        assert setup[0].index("importlib.invalidate_caches()") > setup[0].index(_colab.install_spec())
        assert "restart the runtime" in setup[0]


def test_links_to_other_notebooks_also_open_in_colab():
    """N-20: relative links do not resolve in Colab, so each link to a course notebook is followed by the same
    notebook's Colab link at the tag; stamping is idempotent and leaves other links alone."""
    src = "See [lesson 05](05_t.ipynb#eq) and [the exercises](../exercises/09_x.ipynb), [a site](https://x.org/a.ipynb)."
    once = _colab.stamp_colab_links(src, "notebooks/09_x.ipynb")
    assert once == ("See [lesson 05](05_t.ipynb#eq) ([Colab](" + _colab.colab_url("notebooks/05_t.ipynb") + ")) and "
                    "[the exercises](../exercises/09_x.ipynb) ([Colab](" + _colab.colab_url("exercises/09_x.ipynb")
                    + ")), [a site](https://x.org/a.ipynb).")
    assert _colab.stamp_colab_links(once, "notebooks/09_x.ipynb") == once
    link = re.compile(r"\]\(((?:\.\./)?(?:notebooks/|exercises/|solutions/)?\d\d_\w+\.ipynb)(#[^)\s]*)?\)"
                      r"( \(\[Colab\]\(([^)]*)\)\))?")
    seen = 0
    for path in sorted(ROOT.glob("*/[0-9][0-9]_*.ipynb")):
        for cell in nbk.read(path).cells:
            if cell.cell_type != "markdown":
                continue
            for m in link.finditer(nbk.source_of(cell)):
                target = posixpath.normpath(posixpath.join(path.parent.name, m.group(1)))
                assert m.group(4) == _colab.colab_url(target), (path.name, m.group(0))
                assert (ROOT / target).exists(), (path.name, target)
                seen += 1
    assert seen > 50


def test_site_url_comes_from_the_repository_setting():
    owner, name = _colab.REPOSITORY.split("/")
    assert _colab.site_url() == f"https://{owner.lower()}.github.io/{name}/"
    assert _colab.site_url("Some-Owner/course") == "https://some-owner.github.io/course/"
    line = _colab.site_link_markdown("o/r", published=True)
    assert "[https://o.github.io/r/](https://o.github.io/r/)" in line
    assert _colab.restamp_site_links(f"x\n{line}\ny", "o/r", published=True) == f"x\n{line}\ny"    # idempotent
    assert (_colab.restamp_site_links(f"x\n{line}\ny", "p/q", published=True)
            == f"x\n{_colab.site_link_markdown('p/q', published=True)}\ny")
    assert _colab.restamp_site_links("no link here", "p/q") == "no link here"            # nothing added


def test_readme_links_the_website_at_the_repository_setting():
    text = (ROOT / "README.md").read_text()
    assert text.count(_colab.site_link_markdown()) == 1, "README: the website link, as attn-course release stamps it"
    assert _colab.site_url() in text.split("## Lessons")[0], "the website link comes before the lesson table"


def test_release_restamps_the_readme_website_link(tmp_path, monkeypatch, capsys):
    (tmp_path / "solutions").mkdir()
    nbformat.write(_lesson("Lesson 01"), str(tmp_path / "solutions" / "01_a.ipynb"))
    (tmp_path / "README.md").write_text(f"# Course\n\n{_colab.site_link_markdown('old/place')}\n")
    assert release(tmp_path, check=True) == 1
    assert "stale: README.md" in capsys.readouterr().out
    assert release(tmp_path) == 0 and release(tmp_path, check=True) == 0
    assert _colab.site_link_markdown() in (tmp_path / "README.md").read_text()
    monkeypatch.setattr(_colab, "REPOSITORY", "published-owner/attn_course")
    assert release(tmp_path, check=True) == 1
    assert release(tmp_path) == 0
    assert "https://published-owner.github.io/attn_course/" in (tmp_path / "README.md").read_text()


def test_a_failed_install_says_what_to_do_instead_of_a_raw_pip_error(monkeypatch):
    """Review 2026-11-26 (learner §1): a notebook downloaded from the website, run where the course is not
    installed and cannot be (unpublished, offline), stopped in its first cell with pip's CalledProcessError."""
    import importlib.util
    import subprocess
    import types
    cell = _colab.stamp_setup_source(SETUP).split("import torch")[0]
    calls = []
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "attn_course" else object())
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: calls.append(cmd) or types.SimpleNamespace(returncode=1))
    with pytest.raises(RuntimeError) as err:
        exec(cell, {})
    assert calls and calls[0][-1] == _colab.install_spec()
    msg = str(err.value)
    assert "pip could not install the course package" in msg and "make lab" in msg and "docs/install.md" in msg
    calls.clear()
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: calls.append(cmd) or types.SimpleNamespace(returncode=0))
    exec(cell, {})                                                         # installed: no error
    assert calls
