"""Shared test configuration: a non-interactive matplotlib backend, deterministic seeds."""
import os

os.environ.setdefault("MPLBACKEND", "Agg")
# Triton reads its interpreter flag when it is first imported, and FlexAttention/inductor tests import it
# long before test_flash_triton.py runs: set the flag before ANY test module is collected, so lesson 08's
# Triton kernels always run on CPU under the interpreter (CPU inductor kernels are C++, not Triton).
os.environ["TRITON_INTERPRET"] = "1"

import matplotlib  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

matplotlib.use("Agg")

# Under pytest-xdist (`make test`: -n 2 on a 2-core machine) every worker is a process with torch's default of one
# thread per core: two workers then run four threads on two cores, and each small op waits for a parked thread
# (lesson 08's "threads on a busy machine"). One core's share of threads per worker instead.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    torch.set_num_threads(max(1, torch.get_num_threads() // _WORKERS))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
    import matplotlib.pyplot as plt
    plt.close("all")


@pytest.fixture
def three_threads():
    """Run the test at three torch threads (restored after): a test that checks code setting one thread and
    restoring the count can then fail, whatever the count the test run starts with."""
    n = torch.get_num_threads()
    torch.set_num_threads(3)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def one_thread():
    """Run the test at one torch thread (restored after): small ops are faster and results thread-independent."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
