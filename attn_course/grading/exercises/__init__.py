"""Registry of every exercise in the course: each ``lessonNN`` module here exposes ``EXERCISES``."""
from __future__ import annotations

import importlib
import pkgutil
from functools import lru_cache

from ..spec import Exercise

__all__ = ["registry", "get"]


@lru_cache(maxsize=None)
def registry() -> dict[str, Exercise]:
    """All exercises by id, in lesson order. Raises if two exercises share an id."""
    found: dict[str, Exercise] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not info.name.startswith("lesson"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for ex in module.EXERCISES:
            if ex.id in found:
                raise RuntimeError(f"duplicate exercise id {ex.id!r} in {info.name}")
            found[ex.id] = ex
    return found


def get(exercise_id: str) -> Exercise:
    try:
        return registry()[exercise_id]
    except KeyError:
        raise KeyError(f"unknown exercise id {exercise_id!r}; known: {', '.join(registry())}") from None
