"""Shared test configuration: a non-interactive matplotlib backend, deterministic seeds."""
import os

os.environ.setdefault("MPLBACKEND", "Agg")

import matplotlib  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

matplotlib.use("Agg")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
    import matplotlib.pyplot as plt
    plt.close("all")
