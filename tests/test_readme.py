"""The README's lesson table stays true: every lesson links to an existing notebook, and the exercise
counts it states are those of the solutions notebooks."""
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROW = re.compile(r"^\| (\d\d) \| \[[^\]]+\]\((notebooks/[^)]+\.ipynb)\) \|.*\| ✅ lesson \+ (\d+) exercises")


def _grade_ids(path: Path) -> list[str]:
    cells = json.loads(path.read_text())["cells"]
    return [c["metadata"]["nbgrader"]["grade_id"] for c in cells if "nbgrader" in c.get("metadata", {})]


def test_lesson_table_matches_the_notebooks():
    rows = [ROW.match(line) for line in (ROOT / "README.md").read_text().splitlines()]
    rows = [m for m in rows if m]
    numbers = [int(m.group(1)) for m in rows]
    assert numbers[:8] == list(range(1, 9)) and numbers == sorted(set(numbers))   # 01–08, then wave-2 lessons in order
    for m in rows:
        lesson = ROOT / m.group(2)
        assert lesson.exists(), lesson
        for folder in ("solutions", "exercises"):
            assert (ROOT / folder / lesson.name).exists(), f"{folder}/{lesson.name} missing"
        assert len(_grade_ids(ROOT / "solutions" / lesson.name)) == int(m.group(3)), lesson.name
