# Two commands on a fresh machine: `make lab` and `make test`. Both create .venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PORT   ?= 8888
IP     ?= 127.0.0.1
# Jupyter refuses to start as root (containers, CI boxes) unless told it may
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root)
JOBS   ?= 2
NBVAL  := --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg -p no:cacheprovider

.PHONY: setup lab test test-unit test-notebooks test-browser release bench clean

setup: $(VENV)/.installed

# torch first, pinned to the tested release (a looser pin would download multi-GB CUDA builds),
# then the package with its extras; a range that 2.13.0 satisfies installs nothing more.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	# PYTHONWARNINGS: hush setuptools' informational "Editable installation" notice during the build
	PYTHONWARNINGS=ignore::UserWarning $(BIN)/python -m pip install --quiet -e ".[lab,dev,triton]"
	touch $@

# Serves the repository root (lessons link to ../exercises/ and back) and opens on the README's lesson
# table, rendered (.jupyter/lab/settings/overrides.json: Markdown files open as a preview). The course's
# own Jupyter config dir, .jupyter/, holds custom/custom.css: tabs say lesson / exercises / solutions.
LAB_ENV   := JUPYTER_CONFIG_DIR=.jupyter
LAB_FLAGS := --ServerApp.root_dir=. --LabApp.app_settings_dir=.jupyter/lab/settings --LabApp.custom_css=True --LabApp.default_url=/lab/tree/README.md

lab: setup
	$(LAB_ENV) $(BIN)/jupyter lab --no-browser --ip=$(IP) --port=$(PORT) $(ROOT_FLAG) $(LAB_FLAGS)

test: setup
	$(BIN)/attn-course release --check
	$(MAKE) test-unit test-notebooks test-browser

test-unit: setup
	$(BIN)/python -m pytest tests --ignore=tests/browser -n $(JOBS) -q

# Lessons and solutions: outputs compared. Exercises: must run without unexpected errors.
test-notebooks: setup
	$(BIN)/python -m pytest --nbval $(NBVAL) -n $(JOBS) --dist loadfile notebooks solutions -q
	$(BIN)/python -m pytest --nbval-lax $(NBVAL) -n $(JOBS) --dist loadfile exercises -q

# Every lesson Run All in JupyterLab in headless Chromium, one at a time (tests/browser). Without a
# Chromium it skips with a reason; .ci/run installs Debian's and sets ATTN_COURSE_REQUIRE_BROWSER=1.
test-browser: setup
	$(BIN)/python -m pytest tests/browser -n 0 -q -p no:cacheprovider

release: setup
	$(BIN)/attn-course release

bench: setup
	$(BIN)/attn-course bench

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
