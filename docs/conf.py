"""Sphinx configuration of the course website (``make book``; see docs/about.md for the choices).

Run as ``sphinx-build -W --keep-going -b html -c docs build/book/src build/book/html``: the source folder
``build/book/src`` is staged by :func:`book.stage` from ``docs/``, ``notebooks/`` and ``exercises/`` when
Sphinx starts, so the site always shows the committed notebooks; they are never executed here.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]          # book.py, and this checkout's attn_course for autodoc

import book                                    # noqa: E402
from attn_course import __version__, _colab    # noqa: E402

project = "attn_course"
author = "the attn_course authors"
copyright = "the attn_course authors, MIT licence"
release = version = __version__
html_title = "Attention mechanisms in PyTorch"

extensions = ["myst_nb", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.mathjax", "sphinx.ext.githubpages"]
root_doc = "index"
exclude_patterns = ["_raw/**", "_generated/**", "_mathjax/**", "_assets/**", "**/.ipynb_checkpoints"]

# Notebooks: the committed outputs, never re-executed; Markdown outputs (tables, code listings) parsed as MyST
nb_execution_mode = "off"
nb_render_markdown_format = "myst"
nb_ipywidgets_js = {}                          # explorers are staged as pictures: no widget JavaScript (no CDN)
nb_merge_streams = True
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]
myst_heading_anchors = 4
myst_dmath_double_inline = True

# Math: MathJax 3 from the pip package django-static-mathjax, staged into _static/mathjax/ (book.stage)
mathjax_path = "mathjax/tex-chtml.js"
# An undefined macro is a TeX error (shown as one, and caught by the browser test), not its name in red
mathjax3_config = {"tex": {"packages": {"[-]": ["noundefined"]}}}

# API reference: autodoc, members as listed in each module's __all__
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_inherit_docstrings = False        # (torch's own docstrings, e.g. autograd.Function.forward, are not ours)
autodoc_default_options = {"members": True, "show-inheritance": True}

html_theme = "furo"
html_static_path = ["_static"]
html_css_files = ["course.css"]
html_js_files = ["course.js"]
html_copy_source = False                       # downloads come from the _raw notebooks (book.py)
html_show_sourcelink = False
html_baseurl = _colab.site_url()
html_last_updated_fmt = None
html_theme_options = {"navigation_with_keys": True}


_KEYWORD_ONLY = re.compile(r"(?<=[\s(])\*(?=,)")


def _plain_signatures(app, what, name, obj, options, lines):
    """Docstrings write signatures as plain text (``forward(x, *, mask=None)``): escape the keyword-only
    marker ``*,`` so reStructuredText does not read it as the start of emphasis."""
    lines[:] = [_KEYWORD_ONLY.sub(r"\\*", line) for line in lines]


def _stage(app, config):
    items = book.stage(Path(app.srcdir), ROOT)
    config.html_static_path = [*config.html_static_path, str(Path(app.srcdir) / "_mathjax")]
    print(f"book: staged {sum(bool(i.notebook) for i in items)} lessons and "
          f"{sum(bool(i.exercises) for i in items)} exercise notebooks into {app.srcdir}")


def _prune(app, exc):
    """Delete pages left in the output by a source that is gone (a renamed lesson): Sphinx keeps them."""
    if exc is not None or app.builder.format != "html":
        return
    outdir = Path(app.outdir)
    keep = {f"{doc}.html" for doc in app.env.found_docs} | {"genindex.html", "search.html", "py-modindex.html"}
    for page in outdir.rglob("*.html"):
        rel = page.relative_to(outdir).as_posix()
        if not rel.startswith("_") and rel not in keep:
            page.unlink()


def setup(app):
    app.connect("config-inited", _stage)
    app.connect("autodoc-process-docstring", _plain_signatures)
    app.connect("build-finished", _prune)
