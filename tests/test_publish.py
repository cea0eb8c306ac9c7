"""Publishing made checkable (issue 33; review 2026-11-26 learner §1): ``attn-course release --check-published``
asks whether the repository, the release tag, lesson 01 at the tag and the website answer — here with fake
answers, never the network — and .ci/run skips only that step, saying why, when the hosts cannot be reached.
Until the course is published the README's first lines say where it can be read today."""
import io
import os
import subprocess
import urllib.error
from pathlib import Path

import pytest

from attn_course import __version__, _colab
from attn_course.grading import publish

ROOT = Path(__file__).resolve().parents[1]


class _Answer(io.BytesIO):
    status = 200

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def fake_internet(missing=(), unreachable=(), wrong=()):
    """An ``urlopen`` stand-in: the published course, except the checks whose URL contains a listed word."""
    def opener(req, timeout):
        url = req.full_url
        if any(w in url for w in unreachable):
            raise urllib.error.URLError(OSError(-2, "Name or service not known"))
        if any(w in url for w in missing):
            raise urllib.error.HTTPError(url, 404, "Not Found", {}, None)
        if url.endswith("pyproject.toml"):
            body = f'[project]\nname = "attn_course"\nversion = "{"9.9.9" if "tag" in wrong else __version__}"\n'
        elif url.endswith(".ipynb"):
            body = '{"cells": []}'
        elif "github.io" in url:
            body = "<title>Home - attn_course</title>" if "site" in wrong else f"<title>{publish.TITLE}</title>"
        else:
            body = "<html>repository page</html>"
        return _Answer(body.encode())
    return opener


def run(published, **kw):
    out = io.StringIO()
    code = publish.check_published(out, published=published, opener=fake_internet(**kw))
    return code, out.getvalue()


def test_the_checks_are_what_the_readme_and_the_notebooks_link_to():
    urls = [c.url for c in publish.checks()]
    tag = _colab.git_ref()
    assert urls[0] == f"https://github.com/{_colab.REPOSITORY}"
    assert urls[1] == f"https://raw.githubusercontent.com/{_colab.REPOSITORY}/{tag}/pyproject.toml"
    assert publish.checks()[1].expect == f'version = "{__version__}"'            # the tag holds this version
    assert urls[2].endswith(f"/{tag}/notebooks/01_scaled_dot_product_attention.ipynb")
    assert urls[3] == _colab.site_url()


def test_published_and_everything_answers():
    code, out = run(published=True)
    assert code == 0 and out.count("ok  ") == 4 and "the repository, the tag and the website answer" in out


@pytest.mark.parametrize("kw,what", [({"missing": ("v0.1.0",)}, "tag"), ({"missing": ("github.io",)}, "website"),
                                     ({"wrong": ("tag",)}, "tag"), ({"wrong": ("site",)}, "website")])
def test_published_but_missing_fails(kw, what):
    code, out = run(published=True, **kw)
    assert code == 1 and "FAIL" in out and "false" in out
    assert any(line.startswith("missing") and what in line for line in out.splitlines()), out


def test_before_publishing_missing_is_reported_not_failed():
    code, out = run(published=False, missing=("github",))
    assert code == 0 and "as expected before publishing" in out and "docs/publishing.md" in out


@pytest.mark.parametrize("published", [False, True])
def test_unreachable_is_not_checked_and_says_so(published):
    code, out = run(published=published, unreachable=("github",))
    assert code == publish.UNREACHABLE == 3
    assert "NOT CHECKED" in out and "Name or service not known" in out and out.count("unreachable ") == 4


def _ci_publish_step(tmp_path, exit_status):
    """The publishing step of .ci/run (everything after `make test`), with a fake attn-course."""
    script = (ROOT / ".ci" / "run").read_text().split("time make test\n", 1)[1]
    fake = tmp_path / ".venv" / "bin" / "attn-course"
    fake.parent.mkdir(parents=True)
    fake.write_text(f"#!/bin/sh\necho \"fake check: $*\"\nexit {exit_status}\n")
    fake.chmod(0o755)
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)


def test_ci_skips_only_the_publishing_step_with_a_reason(tmp_path):
    unreachable = _ci_publish_step(tmp_path / "a", 3)
    assert unreachable.returncode == 0 and "--check-published" in unreachable.stdout
    assert "publishing check skipped: the repository, tag or website could not be reached" in unreachable.stdout
    missing = _ci_publish_step(tmp_path / "b", 1)
    assert missing.returncode == 1 and "skipped" not in missing.stdout
    ok = _ci_publish_step(tmp_path / "c", 0)
    assert ok.returncode == 0 and "skipped" not in ok.stdout


def test_the_readme_says_where_to_read_the_course_today_until_published():
    head = "\n".join((ROOT / "README.md").read_text().splitlines()[:12])
    assert _colab.site_link_markdown() in head                           # as `attn-course release` stamps it
    if _colab.PUBLISHED:
        assert "**Read the course online:**" in head
        return
    assert "**Read the course today:**" in head and "make book" in head and "notebooks/" in head
    assert "**After publishing** (not done yet; [docs/publishing.md](docs/publishing.md))" in head
    readme = (ROOT / "README.md").read_text()
    assert "Read the course online" not in readme and "the published site" not in readme
    assert (ROOT / "docs" / "publishing.md").is_file()


def test_site_link_line_before_and_after_publishing():
    before, after = _colab.site_link_markdown("o/r", published=False), _colab.site_link_markdown("o/r", published=True)
    assert before.startswith("**Read the course today:**") and "https://o.github.io/r/" in before
    assert after.startswith("**Read the course online:**") and "after publishing" not in after.lower()
    # restamping switches between the two forms (the README carries exactly one)
    assert _colab.restamp_site_links(f"x\n{before}\ny", "o/r", published=True) == f"x\n{after}\ny"
    assert _colab.restamp_site_links(f"x\n{after}\ny", "o/r", published=False) == f"x\n{before}\ny"


def test_make_target_and_docs_name_the_command():
    make = (ROOT / "Makefile").read_text()
    assert "check-published: $(VENV)/.lab\n\t$(BIN)/attn-course release --check-published" in make
    steps = (ROOT / "docs" / "publishing.md").read_text()
    for step in ("git push -u origin main", "git tag v0.1.0", "git push origin v0.1.0", "Source: **GitHub Actions**",
                 "attn-course release --check-published", "PUBLISHED = True"):
        assert step in steps, step
    assert os.access(ROOT / ".ci" / "run", os.X_OK)
