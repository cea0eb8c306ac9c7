"""Where Colab installs the course from: the ONE place that names the repository.

Every notebook's setup cell installs ``attn_course`` with pip when it is missing (Colab), and each
notebook's first markdown cell carries an "Open in Colab" badge. Both are stamped into the notebooks by
``attn-course release`` from the values below (``attn-course release --check`` fails when a notebook
carries a stale stamp), so publishing the repository elsewhere means changing ``REPOSITORY`` and
re-running ``attn-course release``. The course website's address (:func:`site_url`, GitHub Pages:
``https://<owner>.github.io/<name>/``) derives from it too; ``attn-course release`` stamps it into the README.

The install is pinned to the git tag ``v<version>`` of the package version, so a lesson's committed
outputs come from the same code Colab installs. Tag every release: ``git tag v0.1.0 && git push --tags``.
"""
from __future__ import annotations

import re

from . import __version__

__all__ = ["REPOSITORY", "PUBLISHED", "git_ref", "install_spec", "colab_url", "badge_markdown", "stamp_setup_source",
           "stamp_badge_source", "restamp_badges", "stamp_colab_links", "BADGE_IMAGE", "site_url",
           "site_link_markdown", "restamp_site_links"]

# Change this line when the repository is published under another owner/name (GitHub "owner/name").
REPOSITORY = "attn-course/attn_course"
# True once docs/publishing.md's steps are done and `attn-course release --check-published` passes: the README's
# first lines then link the website as a fact; until then they say where the course can be read today and label
# the online links "after publishing" (stamped by `attn-course release`, like the badge).
PUBLISHED = False

BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"
_BADGE_LINE = re.compile(r"^\[!\[Open In Colab\]\([^)]*\)\]\([^)]*\)[ \t]*$", re.MULTILINE)
_INSTALL = re.compile(r'"git\+https://[^"]*"')
# After the install, in the setup cell: a kernel that has just pip-installed a package must refresh its import
# caches to find it, and a package pip upgraded after the runtime imported it needs a restart (Colab's ipywidgets).
_AFTER_INSTALL = (
    "    importlib.invalidate_caches()                      # so this kernel finds the package just installed\n"
    "    print(\"attn_course installed. If a later cell fails on an import (pip may have upgraded a package this \"\n"
    "          \"runtime had already loaded), restart the runtime and run all cells again.\")\n")
# The install call. Its first stamped form ended in `check=True)`: when pip failed (no network, or the repository or
# its tag not published yet) the learner got a raw CalledProcessError. Stamped now: a message saying what to do.
_CHECKED_CALL = re.compile(r'^( *)subprocess\.run\(\[sys\.executable, "-m", "pip", "install", "-q",\n *'
                           r'("git\+https://[^"]*")\], check=True\)\n', re.MULTILINE)
_INSTALL_FAILED = (
    '"pip could not install the course package (its message is above): no network, or "\n'
    '                           "the course is not published yet (the README\'s first lines say). Run it locally "\n'
    '                           "instead: `make lab` in a copy of the repository (docs/install.md)."')


def _install_call(indent: str, target: str) -> str:
    return (f'{indent}if subprocess.run([sys.executable, "-m", "pip", "install", "-q",\n'
            f'{indent}                   {target}]).returncode != 0:\n'
            f'{indent}    raise RuntimeError({_INSTALL_FAILED})\n')


_INSTALL_CALL_END = re.compile(r'("git\+https://[^"]*"\]\)\.returncode != 0:\n *raise RuntimeError\((?:[^)]|\)(?!\n))*\)\n)'
                               r'(?!    importlib\.invalidate_caches)')
# A markdown link to another notebook of the course, relative to the notebook (``../exercises/09_x.ipynb``,
# ``05_x.ipynb``), not already followed by its Colab link: relative links do not resolve inside Colab.
_NOTEBOOK_LINK = re.compile(r"\]\(((?:\.\./)?(?:notebooks/|exercises/|solutions/)?\d\d_[A-Za-z0-9_]+\.ipynb)(#[^)\s]*)?\)"
                            r"(?! \(\[Colab\])")
_SITE_LINK = re.compile(r"^\*\*Read the course (?:online|today):\*\* .*$", re.MULTILINE)


def git_ref(version: str | None = None) -> str:
    """The git tag the notebooks install from: ``v<version>`` (default: the package version)."""
    return f"v{version or __version__}"


def install_spec(version: str | None = None, repository: str | None = None) -> str:
    """The pip requirement the setup cells install, e.g. ``git+https://github.com/o/r.git@v0.1.0``."""
    return f"git+https://github.com/{repository or REPOSITORY}.git@{git_ref(version)}"


def colab_url(path: str, version: str | None = None, repository: str | None = None) -> str:
    """Colab's URL for ``path`` (relative to the repository root, e.g. ``notebooks/01_x.ipynb``) at the tag."""
    return f"https://colab.research.google.com/github/{repository or REPOSITORY}/blob/{git_ref(version)}/{path}"


def site_url(repository: str | None = None) -> str:
    """The course website (``make book``, published by .github/workflows/pages.yml to GitHub Pages):
    ``https://<owner>.github.io/<name>/`` (GitHub lowercases the owner in Pages host names)."""
    owner, name = (repository or REPOSITORY).split("/")
    return f"https://{owner.lower()}.github.io/{name}/"


def site_link_markdown(repository: str | None = None, published: bool | None = None) -> str:
    """One markdown line, as the README carries it: the website as a fact once ``published`` (default
    :data:`PUBLISHED`); before that, where the course can be read today and the online links labelled
    "after publishing" — no sentence claims a site that was never checked."""
    url = site_url(repository)
    if PUBLISHED if published is None else published:
        return f"**Read the course online:** [{url}]({url}) — every lesson with its outputs, no install needed."
    return ("**Read the course today:** the lessons in `notebooks/` are committed with their outputs (any notebook "
            "viewer shows them; `make lab` runs them), and `make book` builds the website into `build/book/html/` "
            "(it works offline). **After publishing** (not done yet; [docs/publishing.md](docs/publishing.md)): "
            f"the website at {url} and the notebooks' \"Open in Colab\" badges.")


def restamp_site_links(text: str, repository: str | None = None, published: bool | None = None) -> str:
    """``text`` with every existing "Read the course online/today" line replaced by :func:`site_link_markdown`."""
    return _SITE_LINK.sub(lambda _: site_link_markdown(repository, published), text)


def badge_markdown(path: str, version: str | None = None, repository: str | None = None) -> str:
    """One markdown line: the "Open in Colab" badge linking to ``path`` at the tag."""
    return f"[![Open In Colab]({BADGE_IMAGE})]({colab_url(path, version, repository)})"


def stamp_setup_source(source: str, version: str | None = None, repository: str | None = None) -> str:
    """``source`` of a setup cell with its quoted ``"git+https://…"`` install target replaced by
    :func:`install_spec`. Raises ``ValueError`` if the cell names no such target."""
    if not _INSTALL.search(source):
        raise ValueError('the setup cell has no quoted "git+https://..." install target to stamp')
    source = _INSTALL.sub(lambda _: f'"{install_spec(version, repository)}"', source)
    source = _CHECKED_CALL.sub(lambda m: _install_call(m.group(1), m.group(2)), source, count=1)
    return _INSTALL_CALL_END.sub(lambda m: m.group(1) + _AFTER_INSTALL, source, count=1)


def stamp_colab_links(source: str, path: str, version: str | None = None, repository: str | None = None) -> str:
    """Markdown ``source`` of the notebook at ``path`` with every relative link to another course notebook
    followed by `` ([Colab](url))`` — the same notebook opened in Colab at the tag (idempotent)."""
    import posixpath
    folder = posixpath.dirname(path)

    def add(m):
        target = posixpath.normpath(posixpath.join(folder, m.group(1)))
        return f"{m.group(0)} ([Colab]({colab_url(target, version, repository)}))"
    return _NOTEBOOK_LINK.sub(add, source)


def restamp_badges(text: str, path: str, version: str | None = None, repository: str | None = None) -> str:
    """``text`` with every existing "Open in Colab" badge line replaced by the badge for ``path``
    (no badge is added where there is none)."""
    return _BADGE_LINE.sub(lambda _: badge_markdown(path, version, repository), text)


def stamp_badge_source(source: str, path: str, version: str | None = None, repository: str | None = None) -> str:
    """``source`` of a notebook's first markdown cell with the badge for ``path``: an existing badge
    line is replaced; otherwise the badge goes on its own line after the title (the first line)."""
    badge = badge_markdown(path, version, repository)
    if _BADGE_LINE.search(source):
        return _BADGE_LINE.sub(lambda _: badge, source, count=1)
    title, sep, rest = source.partition("\n")
    return f"{title}\n\n{badge}\n" + (f"\n{rest.lstrip(chr(10))}" if rest.strip() else "")
