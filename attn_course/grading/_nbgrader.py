"""nbgrader's autograde step, made to give a crashing or hanging submission the points ``attn-course grade`` gives.

nbgrader runs a submission's cells in one kernel. Out of the box a learner's crash (``os._exit``, a segfault, a
memory bomb killed by the OS) ends the whole submission ("Kernel died" — no grade at all), and a hang costs the
cell timeout and may leave the kernel busy, so the cells after it time out too. :class:`ResilientExecute` replaces
nbgrader's ``Execute`` preprocessor (docs/grading.md, "Grading with nbgrader", shows the two config lines):

* a cell during which the kernel **dies** gets an error output ("the kernel died …") — nbgrader then scores
  that cell 0 — and a fresh kernel is started;
* a cell that runs past ``ExecutePreprocessor.timeout`` is interrupted, as nbgrader does, gets nbgrader's
  ``CellTimeoutError`` output, and the kernel is replaced as well (an interrupt may not stop it);
* after either, the notebook's earlier code cells are run again, silently, in the new kernel — except the
  autograder test cells (they only compute scores) and the cells that crashed or hung — so the learner's other
  answers are defined again, and grading goes on with the next cell.

So each exercise is graded on its own, as in ``attn-course grade``'s sandbox: the crash or hang costs its exercise
only (tests/test_nbgrader.py checks both routes give equal points for a class with a crashing and a hanging
submission). The module imports nbgrader, which only the ``dev`` extra installs.
"""
from __future__ import annotations

import copy

from nbclient.exceptions import DeadKernelError
from nbformat import NotebookNode
from nbgrader.preprocessors import Execute

__all__ = ["ResilientExecute"]

DIED = ("KernelDied", "the kernel died while running this cell (the code crashed the Python process); this cell "
        "scores 0, a new kernel was started and the notebook's earlier cells were run again")


def _is_test_cell(cell) -> bool:
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return bool(meta.get("grade")) and not meta.get("solution")


class ResilientExecute(Execute):
    """nbgrader's ``Execute`` that survives a dead or hung kernel (module docstring)."""

    def preprocess(self, nb, resources=None, retries=None):
        self._skip: set[int] = set()                 # cells that crashed or hung: never run again
        return super().preprocess(nb, resources, retries)

    def preprocess_cell(self, cell, resources, index):
        try:
            cell, resources = super().preprocess_cell(cell, resources, index)
        except DeadKernelError:
            self.log.warning("cell %d: the kernel died; it is restarted and the earlier cells run again", index)
            cell.outputs.append(NotebookNode(output_type="error", ename=DIED[0], evalue=DIED[1],
                                             traceback=[f"{DIED[0]}: {DIED[1]}"]))
            self._replace_kernel(index)
            return cell, self.resources
        if self._timed_out(cell):
            self.log.warning("cell %d: timed out; the kernel is replaced and the earlier cells run again", index)
            self._replace_kernel(index)
        return cell, resources

    def _timed_out(self, cell) -> bool:
        return any(o.get("output_type") == "error" and o.get("ename") == self.error_on_timeout.get("ename")
                   for o in cell.get("outputs", []))

    def _replace_kernel(self, index: int) -> None:
        """A new kernel in place of the dead or hung one, with cells ``0 .. index-1`` run again in it (except
        the test cells and those in ``self._skip``), their recorded outputs left as they were. A cell that crashes
        or hangs while run again joins ``self._skip`` and the replay starts over in a fresh kernel."""
        self._skip.add(index)
        while True:
            self._cleanup_kernel()
            self.km = self.create_kernel_manager()
            self.start_new_kernel()
            self.start_new_kernel_client()
            for i, earlier in enumerate(self.nb.cells[:index]):
                if earlier.cell_type != "code" or i in self._skip or _is_test_cell(earlier):
                    continue
                replay = copy.deepcopy(earlier)
                try:
                    self.execute_cell(replay, i, store_history=False)
                except DeadKernelError:
                    self._skip.add(i)
                    break
                if self._timed_out(replay):
                    self._skip.add(i)
                    break
            else:
                return


def autograde_preprocessors() -> list:
    """nbgrader's own ``Autograde.autograde_preprocessors`` with ``Execute`` replaced by :class:`ResilientExecute`
    — for the course's nbgrader_config.py: ``c.Autograde.autograde_preprocessors = autograde_preprocessors()``."""
    from nbgrader.converters.autograde import Autograde
    default = list(Autograde.class_traits()["autograde_preprocessors"].default())
    assert Execute in default, default                # nbgrader changed its pipeline: look again
    return [ResilientExecute if p is Execute else p for p in default]
