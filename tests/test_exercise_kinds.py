"""Exercise.kind (contract): every exercise records what it asks for, and docs/exercises.md shows it."""
import shutil
from pathlib import Path

import pytest

from attn_course.grading.exercises import registry
from attn_course.grading.release import exercise_table, release
from attn_course.grading.spec import KINDS, Exercise

ROOT = Path(__file__).resolve().parents[1]


def test_kinds_are_the_contracts():
    assert KINDS == ("build", "compute", "predict", "debug", "open")


def test_every_exercise_has_a_kind_and_every_lesson_a_build_exercise():
    exercises = list(registry().values())
    assert all(ex.kind in KINDS for ex in exercises)
    lessons = {ex.id[:2] for ex in exercises if ex.id[:2].isdigit()}
    assert lessons == {f"{n:02d}" for n in range(1, 17)}
    # every lesson has a build exercise; 16 is the course's open capstone (no lesson notebook of its own)
    assert all(any(ex.kind == "build" and ex.id[:2] == n for ex in exercises) for n in lessons - {"16"})
    assert [ex.id for ex in exercises if ex.kind == "open"] == ["16_capstone"]


@pytest.mark.parametrize("kind", ["", "Build", "quiz"])
def test_an_unknown_kind_is_refused(kind):
    with pytest.raises(ValueError, match="kind must be one of build, compute, predict, debug, open"):
        Exercise("xx_demo", 1, "demo", "anything", kind=kind)


def test_the_docs_table_is_generated_and_checked(tmp_path, capsys):
    text = (ROOT / "docs" / "exercises.md").read_text(encoding="utf-8")
    assert text == exercise_table([p.stem for p in sorted((ROOT / "solutions").glob("*.ipynb"))])
    for ex in registry().values():
        assert f"| `{ex.id}` | {ex.kind} |" in text
    root = tmp_path / "course"
    for folder in ("solutions", "exercises", "notebooks", "docs"):
        shutil.copytree(ROOT / folder, root / folder)
    (root / "docs" / "exercises.md").write_text(text.replace("| build |", "| compute |", 1), encoding="utf-8")
    assert release(root, check=True) == 1
    assert "stale: docs/exercises.md (exercise table" in capsys.readouterr().out
    assert release(root) == 0 and (root / "docs" / "exercises.md").read_text(encoding="utf-8") == text
