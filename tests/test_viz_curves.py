"""viz.spread and viz.plot_loss_curves: the numbers against numpy/statistics, the band against the runs."""
import statistics

import matplotlib
import numpy as np
import pytest

from attn_course import viz

matplotlib.use("Agg")


def test_spread_matches_statistics():
    v = [0.81, 0.78, 0.85, 0.90]
    s = viz.spread(v)
    assert s.n == 4 and s.lo == 0.78 and s.hi == 0.90
    assert s.mean == pytest.approx(statistics.mean(v), abs=1e-15)
    assert s.sd == pytest.approx(statistics.stdev(v), abs=1e-15)
    assert str(s) == "0.835 ± 0.052 (n=4, 0.780–0.900)"
    assert s.format(1) == "0.8 ± 0.1 (n=4, 0.8–0.9)"


def test_spread_one_value_and_errors():
    assert viz.spread([2.0]).sd == 0.0
    with pytest.raises(ValueError, match="at least one"):
        viz.spread([])
    with pytest.raises(ValueError, match="non-finite"):
        viz.spread([1.0, float("nan")])


def test_plot_loss_curves_mean_band_and_smoothing():
    runs = {"a": [[4.0, 2.0, 1.0], [2.0, 2.0, 3.0]], "b": [[1.0, 1.0, 1.0]]}
    ax = viz.plot_loss_curves(runs, title="t")
    lines = ax.get_lines()
    np.testing.assert_allclose(lines[0].get_ydata(), [3.0, 2.0, 2.0])
    np.testing.assert_allclose(lines[1].get_ydata(), [1.0, 1.0, 1.0])
    assert "2 seeds" in lines[0].get_label() and "1 seed)" in lines[1].get_label()
    assert len(ax.collections) == 1                       # a band only where there are several seeds
    band = ax.collections[0].get_paths()[0].vertices
    assert band[:, 1].max() == 4.0 and band[:, 1].min() == 1.0
    ax2 = viz.plot_loss_curves({"a": [[4.0, 2.0, 0.0, 2.0]]}, smooth=2)
    np.testing.assert_allclose(ax2.get_lines()[0].get_ydata(), [4.0, 3.0, 1.0, 1.0])


def test_plot_loss_curves_errors():
    with pytest.raises(ValueError, match="empty"):
        viz.plot_loss_curves({})
    with pytest.raises(ValueError, match=r"different lengths \[2, 3\]"):
        viz.plot_loss_curves({"a": [[1, 2], [1, 2, 3]]})
