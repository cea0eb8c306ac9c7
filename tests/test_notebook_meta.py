"""What JupyterLab and a learner see before running anything: one kernelspec, working cross-links."""
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# What ipykernel installs and JupyterLab writes back: a notebook saying anything else ("Python 3")
# turns "modified" the moment it is opened (the browser test checks that too).
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
NOTEBOOKS = sorted(p.relative_to(REPO).as_posix() for d in ("notebooks", "solutions", "exercises")
                   for p in (REPO / d).glob("*.ipynb"))
LESSONS = sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb"))


def markdown(path: Path) -> str:
    nb = json.loads(path.read_text())
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")


@pytest.mark.parametrize("path", NOTEBOOKS)
def test_one_kernelspec_everywhere(path):
    assert json.loads((REPO / path).read_text())["metadata"]["kernelspec"] == KERNELSPEC


def test_ipykernel_installs_that_kernelspec():
    from ipykernel.kernelspec import get_kernel_dict
    spec = get_kernel_dict()
    assert spec["display_name"] == KERNELSPEC["display_name"] and spec["language"] == KERNELSPEC["language"]


@pytest.mark.parametrize("lesson", LESSONS)
def test_lesson_and_exercises_link_to_each_other(lesson):
    """Links are relative (``../exercises/X.ipynb``), so they work in JupyterLab served from the
    repository root (``make lab``), on GitHub and in a clone; every target exists."""
    assert f"](../exercises/{lesson})" in markdown(REPO / "notebooks" / lesson)
    for d in ("solutions", "exercises"):
        assert f"](../notebooks/{lesson})" in markdown(REPO / d / lesson)
    for d in ("notebooks", "solutions", "exercises"):
        for target in re.findall(r"\]\((\.\./[^)#\s]+\.ipynb)", markdown(REPO / d / lesson)):
            assert (REPO / d / target).resolve().is_file(), f"{d}/{lesson} links to missing {target}"


def _prose(md: str) -> str:
    """Markdown without its math ($…$, $$…$$), code spans and fenced code."""
    for pattern in (r"```.*?```", r"\$\$.*?\$\$", r"(?<!\\)\$[^$\n]*\$", r"`[^`\n]*`"):
        md = re.sub(pattern, "", md, flags=re.S)
    return md


@pytest.mark.parametrize("path", NOTEBOOKS)
def test_no_raw_tex_in_prose(path):
    """``x_{t−1}`` or ``e^{m−m_new}`` outside ``$…$`` shows its braces in JupyterLab: write math as math."""
    raw = re.findall(r"\S*[_^]\{[^}\n]*\}\S*", _prose(markdown(REPO / path)))
    assert raw == [], f"TeX outside $…$: {raw[:5]}"
