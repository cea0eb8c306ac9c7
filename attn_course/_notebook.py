"""Two small notebook helpers shared by the explorers, the training progress bar and ``viz``."""
from __future__ import annotations

import functools

__all__ = ["in_kernel", "saved_box"]


def in_kernel() -> bool:
    """True inside a Jupyter/Colab kernel (not a bare IPython shell, a script or a test)."""
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython ships with ipywidgets
        return False
    return getattr(get_ipython(), "kernel", None) is not None


@functools.cache
def saved_box(kind: str = "VBox"):
    """An ipywidgets ``VBox``/``HBox`` class whose *saved* output is readable without a kernel.

    JupyterLab shows a never-run (untrusted) notebook's outputs with safe renderers only, so a plain
    widget shows its text repr (``VBox(children=(HTML(...``). An instance's ``saved_text`` replaces that
    ``text/plain`` (deterministic, so nbval compares it) and its ``snapshot`` bundle (e.g.
    ``{"image/png": ...}``) is added to it; once the cell runs, the live widget is shown instead.
    """
    import ipywidgets as W

    class SavedBox(getattr(W, kind)):
        saved_text: str | None = None
        snapshot: dict | None = None

        def _repr_mimebundle_(self, **kwargs):
            bundle = super()._repr_mimebundle_(**kwargs)
            if self.saved_text is not None:
                bundle["text/plain"] = self.saved_text
            return {**bundle, **(self.snapshot or {})}

    SavedBox.__name__ = SavedBox.__qualname__ = f"Saved{kind}"
    return SavedBox
