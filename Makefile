# Two commands on a fresh machine: `make lab` (what the lessons need) and `make test` (plus the test tools).
# Both create .venv first. `make lab` after `make test` installs nothing (the test set-up includes the lab's).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PORT   ?= 8888
IP     ?= 127.0.0.1
# Jupyter refuses to start as root (containers, CI boxes) unless told it may
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root)
JOBS   ?= 2
NBVAL  := --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg -p no:cacheprovider
# The tested torch release, and where pip gets it. Empty TORCH_INDEX_URL: pip's default index (PyPI),
# whose Linux x86_64 wheel is the CUDA build. `make lab TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu`
# installs the CPU-only build instead (README, "Which torch gets installed").
TORCH_VERSION   := 2.13.0
TORCH_INDEX_URL ?=
TORCH_PIP_FLAGS := $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL))
# The second CPU configuration of `make test-portable`: no vector instructions beyond the baseline, one thread
PORTABLE_ENV := ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
# Notebook kernels started by nbval run tests/device_probe.py first (an IPython startup file in build/ipython):
# it fails a cell that feeds a tensor created without `device=` to a module moved to `device`, the CPU-visible
# form of a GPU bug. The folder is built, not committed: IPython writes its history there.
PROBE_DIR    := build/ipython
PROBE        := $(PROBE_DIR)/profile_default/startup/00-attn-course-device-probe.py
DEVICE_PROBE := IPYTHONDIR=$(CURDIR)/$(PROBE_DIR)

.PHONY: setup lab test test-unit test-notebooks test-portable test-browser book test-book release check-published bench bench-full clean python-check

# Before anything is installed, on every run: $(PYTHON) is 3.10-3.14 (torch 2.13.0's wheels), and an existing
# .venv/ was made by that same Python (a .venv/ left by another Python is never reused: the message says what to do)
python-check:
	@$(PYTHON) tools/check_python.py $(VENV)

# Stamps: .torch (venv + torch), .lab (the course + JupyterLab), .book (the course + the website's tools),
# .dev (+ test tools and triton; implies .lab and .book)
$(VENV)/.torch: | python-check
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==$(TORCH_VERSION) $(TORCH_PIP_FLAGS)
	touch $@

# PYTHONWARNINGS: hush setuptools' informational "Editable installation" notice during the build.
# The package asks for torch>=2.5, which the torch above satisfies: pip installs no other torch.
# editable_mode=compat puts this folder on sys.path (a .pth file) instead of an import hook that runs after
# Python's own path search: with the hook, `import attn_course` from the folder *above* a checkout named
# attn_course found the checkout itself as an empty namespace package ("cannot import name 'attention'").
EDITABLE := --config-settings editable_mode=compat
$(VENV)/.lab: $(VENV)/.torch pyproject.toml
	PYTHONWARNINGS=ignore::UserWarning $(BIN)/python -m pip install --quiet $(EDITABLE) -e ".[lab]"
	touch $@

$(VENV)/.book: $(VENV)/.torch pyproject.toml
	PYTHONWARNINGS=ignore::UserWarning $(BIN)/python -m pip install --quiet $(EDITABLE) -e ".[book]"
	touch $@

$(VENV)/.dev: $(VENV)/.torch pyproject.toml
	PYTHONWARNINGS=ignore::UserWarning $(BIN)/python -m pip install --quiet $(EDITABLE) -e ".[lab,dev,triton,book]"
	touch $@ $(VENV)/.lab $(VENV)/.book

setup: $(VENV)/.dev

$(PROBE): tests/device_probe.py
	mkdir -p $(@D)
	cp tests/device_probe.py $@

# Serves the repository root (lessons link to ../exercises/ and back) and opens on the README's lesson
# table, rendered (.jupyter/lab/settings/overrides.json: Markdown files open as a preview). The course's
# own Jupyter config dir, .jupyter/, holds custom/custom.css: tabs say lesson / exercises / solutions.
LAB_ENV   := JUPYTER_CONFIG_DIR=.jupyter
LAB_FLAGS := --ServerApp.root_dir=. --LabApp.app_settings_dir=.jupyter/lab/settings --LabApp.custom_css=True --LabApp.default_url=/lab/tree/README.md

lab: $(VENV)/.lab
	$(LAB_ENV) $(BIN)/jupyter lab --no-browser --ip=$(IP) --port=$(PORT) $(ROOT_FLAG) $(LAB_FLAGS)

test: setup
	$(BIN)/attn-course release --check
	$(MAKE) test-unit test-notebooks test-portable test-browser test-book

test-unit: setup
	$(BIN)/python -m pytest tests --ignore=tests/browser -n $(JOBS) -q

# Lessons and solutions: outputs compared. Exercises: must run without unexpected errors.
test-notebooks: setup $(PROBE)
	$(DEVICE_PROBE) $(BIN)/python -m pytest --nbval $(NBVAL) -n $(JOBS) --dist loadfile notebooks solutions -q
	$(DEVICE_PROBE) $(BIN)/python -m pytest --nbval-lax $(NBVAL) -n $(JOBS) --dist loadfile exercises -q

# Lessons and solutions again, on a second CPU configuration: committed outputs must not depend on the CPU's
# vector instructions or on the thread count (issue 22). Reproduce one lesson by hand with
#   ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 .venv/bin/python -m pytest --nbval ... NB.ipynb
test-portable: setup $(PROBE)
	$(PORTABLE_ENV) $(DEVICE_PROBE) $(BIN)/python -m pytest --nbval $(NBVAL) -n $(JOBS) --dist loadfile notebooks solutions -q

# Every lesson Run All in JupyterLab in headless Chromium (tests/browser), JOBS lessons at a time (one JupyterLab
# and one Chromium per pytest-xdist worker; on 2 cores: four lessons 154 s against 189 s one at a time, the same
# hour; the whole stage 8.5 min, against 10.6-11.7 min one at a time in earlier hours). Without a
# Chromium it skips with a reason; .ci/run installs Debian's and sets ATTN_COURSE_REQUIRE_BROWSER=1.
test-browser: setup
	$(BIN)/python -m pytest tests/browser --ignore=tests/browser/test_book.py -n $(JOBS) -q -p no:cacheprovider

# The course website (docs/about.md): docs/ and the committed notebooks, never executed, staged into
# $(BOOK_SRC) by docs/conf.py and rendered by Sphinx + MyST-NB into $(BOOK). Offline; a warning is an error.
# test-book opens every page in headless Chromium (tests/browser/test_book.py); screenshots: build/book/screenshots/
BOOK_SRC := build/book/src
BOOK     := build/book/html
book: $(VENV)/.book
	mkdir -p $(BOOK_SRC)
	$(BIN)/sphinx-build -W --keep-going -q -b html -c docs $(BOOK_SRC) $(BOOK)
	@echo "the website is in $(BOOK)/index.html"

test-book: setup book
	$(BIN)/python -m pytest tests/browser/test_book.py -n 0 -q -p no:cacheprovider

release: setup
	$(BIN)/attn-course release

# Do the repository, the release tag and the website answer? (docs/publishing.md; needs the internet: exit 3
# when a host cannot be reached, which .ci/run reports as a skipped step)
check-published: $(VENV)/.lab
	$(BIN)/attn-course release --check-published

# The three suites (attention, sparse, linear) at small lengths. bench-full: the recorded grids. The benchmarks
# need only the course and torch (.lab): no test tools. Their duration is printed by the bench itself (EXPECTED
# in attn_course/bench/__init__.py), which the README and `attn-course bench --help` quote.
bench: $(VENV)/.lab
	$(BIN)/attn-course bench --suite all

bench-full: $(VENV)/.lab
	$(BIN)/attn-course bench --suite all --full

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
