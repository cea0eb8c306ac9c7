"""The README's lesson table stays true: every lesson links to an existing notebook, and the exercise
counts it states are those of the solutions notebooks."""
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROW = re.compile(r"^\| (\d\d) \| \[[^\]]+\]\((notebooks/[^)]+\.ipynb)\) \|.*\| ✅ lesson \+ \[(\d+) exercises\]\(exercises/([^)]+\.ipynb)\)")


def _grade_ids(path: Path) -> list[str]:
    """The exercises: nbgrader solution cells (each check cell beside one is an autograder test)."""
    cells = json.loads(path.read_text())["cells"]
    return [c["metadata"]["nbgrader"]["grade_id"] for c in cells
            if c.get("metadata", {}).get("nbgrader", {}).get("solution")]


def test_lesson_table_matches_the_notebooks():
    rows = [ROW.match(line) for line in (ROOT / "README.md").read_text().splitlines()]
    rows = [m for m in rows if m]
    lessons = sorted(p.name[:2] for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert [m.group(1) for m in rows] == lessons         # every lesson in notebooks/, in order, listed once
    for m in rows:
        lesson = ROOT / m.group(2)
        assert lesson.exists(), lesson
        for folder in ("solutions", "exercises"):
            assert (ROOT / folder / lesson.name).exists(), f"{folder}/{lesson.name} missing"
        assert len(_grade_ids(ROOT / "solutions" / lesson.name)) == int(m.group(3)), lesson.name
        assert m.group(4) == lesson.name                     # the exercise link is this lesson's
