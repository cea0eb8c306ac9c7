"""``attn-course release --check-published``: does what the README and the notebooks link to answer?

The course names one repository (:data:`attn_course._colab.REPOSITORY`) and one release tag (``v<version>``):
every notebook's setup cell installs ``git+https://github.com/<repository>.git@<tag>``, every "Open in Colab"
badge opens ``<repository>/blob/<tag>/<notebook>``, and the README links the website
(:func:`attn_course._colab.site_url`). This check asks the internet whether each of them exists:

1. the repository page, ``https://github.com/<repository>``;
2. the tag: ``pyproject.toml`` at the tag (raw.githubusercontent.com) declares the package version the setup
   cells pin — what ``pip install git+…@<tag>`` would build;
3. lesson 01 at the tag (what its Colab badge opens);
4. the website: its landing page answers and carries the course's title.

Each check ends in one of three verdicts: ``ok``, ``missing`` (the host answered: not found, or the wrong
content) and ``unreachable`` (no answer: no network, DNS, a proxy — nothing was checked). Exit status: 0 when
every check is ok; 1 when something is missing (the README's online links would be false); 3 when a host could
not be reached and nothing was missing — CI (``.ci/run``) prints that the step was skipped, and why. Until the
course is published (:data:`attn_course._colab.PUBLISHED` is False), missing pieces are reported but do not fail:
the README then labels the online links "after publishing" (docs/publishing.md has the steps).
"""
from __future__ import annotations

import sys
import urllib.error
import urllib.request
from dataclasses import dataclass

__all__ = ["Check", "checks", "probe", "check_published", "UNREACHABLE"]

UNREACHABLE = 3
TITLE = "Attention mechanisms in PyTorch"          # docs/conf.py's html_title: the site's every page carries it


@dataclass
class Check:
    what: str
    url: str
    expect: str | None = None                      # a text the answer must contain (None: any 200 answer)


def checks(repository: str | None = None, version: str | None = None) -> list[Check]:
    """What the README and the notebooks link to, for ``repository`` at the tag of ``version``."""
    from .. import __version__, _colab
    from .release import README_BADGE_TARGET
    repo, ver = repository or _colab.REPOSITORY, version or __version__
    tag = _colab.git_ref(ver)
    raw = f"https://raw.githubusercontent.com/{repo}/{tag}"
    return [Check("repository", f"https://github.com/{repo}"),
            Check(f"tag {tag} (the setup cells install it)", f"{raw}/pyproject.toml", f'version = "{ver}"'),
            Check(f"{README_BADGE_TARGET} at {tag} (its Colab badge opens it)", f"{raw}/{README_BADGE_TARGET}",
                  '"cells"'),
            Check("website", _colab.site_url(repo), TITLE)]


def probe(check: Check, timeout: float = 15.0, opener=urllib.request.urlopen) -> tuple[str, str]:
    """``(verdict, detail)`` for one check: ``ok``, ``missing`` or ``unreachable``."""
    req = urllib.request.Request(check.url, headers={"User-Agent": "attn-course-check-published"})
    try:
        with opener(req, timeout=timeout) as resp:
            body = resp.read(2_000_000).decode("utf-8", "replace")
            status = getattr(resp, "status", 200)
    except urllib.error.HTTPError as exc:          # the host answered
        if exc.code in (404, 410):
            return "missing", f"HTTP {exc.code}"
        return "unreachable", f"HTTP {exc.code} {exc.reason}"
    except (urllib.error.URLError, OSError, ValueError) as exc:     # DNS, refused, timeout, proxy
        return "unreachable", str(getattr(exc, "reason", exc))
    if status != 200:
        return "unreachable", f"HTTP {status}"
    if check.expect is not None and check.expect not in body:
        return "missing", f"answers, but without {check.expect!r}"
    return "ok", f"HTTP {status}"


def check_published(stream=None, timeout: float = 15.0, published: bool | None = None, opener=None) -> int:
    """Run every check, print one line each and a verdict; return the exit status (module docstring)."""
    from .. import _colab
    stream = stream or sys.stdout
    published = _colab.PUBLISHED if published is None else published
    verdicts = []
    for c in checks():
        verdict, detail = probe(c, timeout, **({"opener": opener} if opener else {}))
        verdicts.append(verdict)
        print(f"{verdict:<12}{c.what}: {c.url} ({detail})", file=stream)
    missing, unreachable = verdicts.count("missing"), verdicts.count("unreachable")
    state = "published" if published else "not published yet (attn_course/_colab.py: PUBLISHED = False)"
    if missing and published:
        print(f"FAIL: {missing} of {len(verdicts)} missing, but the course says it is published: the README's "
              f"online links and the notebooks' Colab badges are false (docs/publishing.md)", file=stream)
        return 1
    if unreachable:
        print(f"NOT CHECKED: {unreachable} of {len(verdicts)} could not be reached from this machine (no network?); "
              f"the course is {state}", file=stream)
        return UNREACHABLE
    if missing:
        print(f"as expected before publishing: {missing} of {len(verdicts)} missing; the README labels the online "
              f"links 'after publishing'. Steps: docs/publishing.md", file=stream)
        return 0
    print(f"ok: the repository, the tag and the website answer" + (
        "" if published else "; set PUBLISHED = True in attn_course/_colab.py and run `attn-course release`"),
          file=stream)
    return 0
