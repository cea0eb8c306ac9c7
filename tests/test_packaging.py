"""Packaging: environment.yml and pyproject.toml list the same dependencies; torch pin; Makefile (a light
`make lab`, the test tools only for `make test`, the torch index, the second CPU configuration); README."""
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
TESTED_TORCH = "2.13.0"


def _pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _pyproject_requirements(extras=("lab", "dev", "triton", "book")) -> dict[str, Requirement]:
    proj = _pyproject()["project"]
    reqs = list(proj["dependencies"])
    for extra in extras:
        reqs += proj["optional-dependencies"][extra]
    out = {}
    for line in reqs:
        r = Requirement(line)
        name = canonicalize_name(r.name)
        assert name not in out or str(out[name].specifier) == str(r.specifier), f"{name} listed twice, differently"
        out[name] = r
    return out


def _environment_pip_requirements() -> dict[str, Requirement]:
    """The `- pip:` list of environment.yml (parsed by hand: no YAML library needed)."""
    lines = (ROOT / "environment.yml").read_text().splitlines()
    start = next(i for i, l in enumerate(lines) if l.strip() == "- pip:")
    indent = len(lines[start + 1]) - len(lines[start + 1].lstrip())
    out = {}
    for l in lines[start + 1:]:
        if l.strip().startswith("#") or not l.strip():
            continue
        if len(l) - len(l.lstrip()) < indent:
            break
        item = l.strip()[2:].split("#")[0].strip()
        if item.startswith("-e") or item == ".":
            continue                                    # the course package itself
        r = Requirement(item)
        out[canonicalize_name(r.name)] = r
    return out


def test_environment_yml_lists_the_same_dependencies_as_pyproject():
    """The learner set, as `make lab` installs it: the course's dependencies and [lab], no test tools
    (review 2026-11-26 learner §2: environment.yml installed pytest, playwright, nbgrader, transformers, triton)."""
    py, env = _pyproject_requirements(("lab",)), _environment_pip_requirements()
    assert not set(env) & TEST_TOOLS
    assert sorted(env) == sorted(py), (
        f"drift: only in environment.yml {sorted(set(env) - set(py))}, only in pyproject {sorted(set(py) - set(env))}")
    for name, r in py.items():
        if name == "torch":
            continue
        assert str(env[name].specifier) == str(r.specifier), f"{name}: env {env[name].specifier} vs pyproject {r.specifier}"


def test_ranges_not_pins_except_torch():
    for name, r in _pyproject_requirements(("lab", "dev", "triton")).items():
        assert not any(s.operator == "==" for s in r.specifier), f"{name} is pinned exactly in pyproject.toml"
    for name, r in _environment_pip_requirements().items():
        if name != "torch":
            assert not any(s.operator == "==" for s in r.specifier), f"{name} is pinned in environment.yml"


def test_environment_pins_the_tested_torch_and_pyproject_admits_it():
    env_torch = _environment_pip_requirements()["torch"]
    assert str(env_torch.specifier) == f"=={TESTED_TORCH}"
    assert Version(TESTED_TORCH) in _pyproject_requirements()["torch"].specifier


def _environment_python() -> str:
    py_env = re.search(r"^\s*-\s*python\s*([<>=!~].*)$", (ROOT / "environment.yml").read_text(), re.M)
    return py_env.group(1).strip()


def test_environment_installs_the_package_and_a_supported_python():
    """Python bounded to torch 2.13.0's wheels (3.10-3.14: unbounded, conda picks 3.15, which has none), the
    course installed editable in compat mode as `make lab` does (review 2026-11-26 learner §2)."""
    text = (ROOT / "environment.yml").read_text()
    assert re.search(r"^\s*-\s*-e\s+\.\s+--config-settings editable_mode=compat\s*$", text, re.M), \
        "environment.yml must pip-install the course as make lab does (-e . --config-settings editable_mode=compat)"
    from packaging.specifiers import SpecifierSet
    bound = SpecifierSet(_environment_python())
    assert [v for v in ("3.9", "3.10", "3.14", "3.15") if v in bound] == ["3.10", "3.14"], bound
    assert SpecifierSet(_pyproject()["project"]["requires-python"]).contains("3.10")
    lowest = next(s.version for s in bound if s.operator == ">=")
    assert _pyproject()["project"]["requires-python"] == f">={lowest}"


def _resolve(tmp_path, *python_versions: str) -> dict[str, subprocess.CompletedProcess]:
    """One ``pip install --dry-run`` per Python version, run at the same time (each is mostly waiting on the
    package index): ``{version: its finished process}``."""
    procs = {}
    for python_version in python_versions:
        reqs = tmp_path / f"requirements-{python_version}.txt"
        reqs.write_text("\n".join(str(r) for r in _environment_pip_requirements().values()) + "\n")
        procs[python_version] = subprocess.Popen(
            [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
             "--only-binary=:all:", "--python-version", python_version, "--report",
             str(tmp_path / f"report-{python_version}.json"), "-r", str(reqs)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    done = {}
    try:
        for version, proc in procs.items():
            out, err = proc.communicate(timeout=900)
            done[version] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return done


def test_environment_resolves_on_the_lowest_and_highest_python_it_allows(tmp_path):
    """pip resolves environment.yml's requirements (binary wheels only, this machine's platform) for Python 3.10
    and 3.14, and fails for 3.15: the upper bound is needed. Needs the package index (as `make lab` does)."""
    import json
    resolved = _resolve(tmp_path, "3.10", "3.14", "3.15")
    for version in ("3.10", "3.14"):
        res = resolved[version]
        assert res.returncode == 0, f"Python {version}: {res.stderr[-3000:]}"
        report = json.loads((tmp_path / f"report-{version}.json").read_text())
        got = {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"] for i in report["install"]}
        assert Version(got["torch"]).public == TESTED_TORCH and "jupyterlab" in got, got
        assert not set(got) & {"pytest", "nbgrader", "playwright", "transformers", "sphinx"}
    res = resolved["3.15"]
    assert res.returncode != 0 and "torch==2.13.0" in res.stderr, res.stderr[-2000:]


def test_console_script_and_package_data():
    proj = _pyproject()["project"]
    assert proj["scripts"]["attn-course"] == "attn_course.cli:main"
    assert {"lab", "dev", "triton", "book"} <= set(proj["optional-dependencies"])


def _make_recipe(target: str) -> list[str]:
    lines = (ROOT / "Makefile").read_text().splitlines()
    start = next(i for i, l in enumerate(lines) if re.match(rf"^{re.escape(target)}\s*:", l))
    recipe = []
    for l in lines[start + 1:]:
        if not l.startswith("\t"):
            break
        recipe.append(l.strip())
    return recipe


TEST_TOOLS = {"pytest", "pytest-xdist", "nbval", "nbclient", "nbgrader", "playwright", "transformers", "triton"}


def test_makefile_installs_tested_torch_before_the_package():
    make = (ROOT / "Makefile").read_text()
    assert re.search(rf"^TORCH_VERSION\s*:=\s*{re.escape(TESTED_TORCH)}\s*$", make, re.M)
    torch_recipe = _make_recipe("$(VENV)/.torch")
    assert any("pip install" in l and "torch==$(TORCH_VERSION) $(TORCH_PIP_FLAGS)" in l for l in torch_recipe)
    for stamp, extras in (("$(VENV)/.lab", "lab"), ("$(VENV)/.book", "book"), ("$(VENV)/.dev", "lab,dev,triton,book")):
        deps = re.search(rf"^{re.escape(stamp)}\s*:(.*)$", make, re.M).group(1).split()
        assert deps[0] == "$(VENV)/.torch" and "pyproject.toml" in deps, stamp
        assert any(re.search(rf'pip install .*\$\(EDITABLE\) -e "\.\[{extras}\]"', l) for l in _make_recipe(stamp)), stamp
    # a checkout named attn_course must not shadow the package when Python runs from the folder above it
    assert re.search(r"^EDITABLE\s*:=\s*--config-settings editable_mode=compat\s*$", make, re.M)
    for target, stamp in (("lab", "$(VENV)/.lab"), ("test", "setup"), ("setup", "$(VENV)/.dev")):
        deps = re.search(rf"^{target}\s*:(.*)$", make, re.M).group(1)
        assert stamp in deps.split(), f"make {target} must depend on {stamp}"


def test_the_lab_extra_holds_no_test_tool():
    extras = _pyproject()["project"]["optional-dependencies"]
    lab = {canonicalize_name(Requirement(r).name) for r in extras["lab"]}
    test = {canonicalize_name(Requirement(r).name) for r in extras["dev"] + extras["triton"]}
    assert lab == {"jupyterlab", "ipykernel"} and not lab & TEST_TOOLS
    assert TEST_TOOLS <= test
    book = {canonicalize_name(Requirement(r).name) for r in extras["book"]}     # the website's tools: not for `make lab`
    assert {"sphinx", "myst-nb"} <= book and not book & lab


def _dry_run(tmp_path, *args):
    """``make -n ARGS`` in a copy of the Makefile and pyproject.toml: the commands make would run."""
    res = subprocess.run(["make", "-n", *args], cwd=tmp_path, capture_output=True, text=True, check=True)
    return res.stdout


def test_make_lab_is_light_test_adds_the_tools_and_nothing_is_installed_twice(tmp_path):
    if shutil.which("make") is None:
        import pytest
        pytest.skip("no make on this machine")
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    lab = _dry_run(tmp_path, "lab")
    assert "torch==2.13.0" in lab and '-e ".[lab]"' in lab and "dev" not in lab.split("jupyter")[0]
    assert "--index-url" not in lab                                     # PyPI unless asked
    url = "https://download.pytorch.org/whl/cpu"
    with_index = _dry_run(tmp_path, "lab", f"TORCH_INDEX_URL={url}").splitlines()
    assert [l for l in with_index if "--index-url" in l] == [l for l in with_index if "torch==2.13.0" in l]
    assert any(l.endswith(f"torch==2.13.0 --index-url {url}") for l in with_index)
    assert '".[lab,dev,triton,book]"' in _dry_run(tmp_path, "setup")
    venv = tmp_path / ".venv"                                           # after `make test`: every stamp exists
    venv.mkdir()
    for stamp in (".torch", ".dev", ".lab", ".book"):
        (venv / stamp).touch()
    lab_again = _dry_run(tmp_path, "lab")
    assert "pip install" not in lab_again and "jupyter lab" in lab_again
    assert "pip install" not in _dry_run(tmp_path, "setup")
    assert "pip install" not in _dry_run(tmp_path, "book") and "sphinx-build -W" in _dry_run(tmp_path, "book")


def test_make_test_runs_the_second_cpu_configuration():
    make = (ROOT / "Makefile").read_text()
    assert "test-portable" in " ".join(_make_recipe("test"))
    env = re.search(r"^PORTABLE_ENV\s*:=\s*(.*)$", make, re.M).group(1).split()
    assert env == ["ATEN_CPU_CAPABILITY=default", "OMP_NUM_THREADS=1", "MKL_NUM_THREADS=1"]
    (line,) = _make_recipe("test-portable")
    assert line.startswith("$(PORTABLE_ENV)") and "--nbval $(NBVAL)" in line and line.endswith("notebooks solutions -q")
    assert "--nbval-lax" not in line                                   # outputs compared, as in test-notebooks


def test_make_bench_is_the_quick_run_and_bench_full_the_recorded_one():
    assert _make_recipe("bench") == ["$(BIN)/attn-course bench --suite all"]
    assert _make_recipe("bench-full") == ["$(BIN)/attn-course bench --suite all --full"]
    # review 2026-11-26 (learner §9): the benchmarks need the lab set only, not the test toolchain (setup)
    make = (ROOT / "Makefile").read_text()
    for target in ("bench", "bench-full"):
        assert re.search(rf"^{target}\s*:(.*)$", make, re.M).group(1).split() == ["$(VENV)/.lab"], target


def test_bench_duration_is_stated_once_and_the_same_everywhere(capsys):
    """The README, `attn-course bench --help` and the line a run prints first quote one measured range."""
    from attn_course.bench import cli
    assert cli.QUICK_ALL in cli.parser().format_help().replace("\n", " ").replace("  ", " ") or \
        " ".join(cli.QUICK_ALL.split()) in " ".join(cli.parser().format_help().split())
    readme = " ".join((ROOT / "README.md").read_text().split())
    bench_section = readme.split("## Benchmark", 1)[1].split("## ", 1)[0]
    assert f"takes {cli.QUICK_ALL}" in bench_section
    assert "about two minutes" not in bench_section and "about three" not in cli.DESCRIPTION
    assert cli.expected_duration("all", False).endswith(cli.QUICK_ALL)


def test_a_bench_run_prints_its_expected_duration_once(monkeypatch, capsys):
    from attn_course.bench import cli
    monkeypatch.setattr(cli, "run_one", lambda name, args, **kw: {"suite": name})
    monkeypatch.setattr(cli, "report", lambda record: f"table of {record['suite']}")
    assert cli.main(["--suite", "all", "--device", "cpu"]) == 0
    out, err = capsys.readouterr()
    assert err.count("expected duration") == 1 and cli.QUICK_ALL in err
    assert [line for line in out.splitlines() if line] == ["table of attention", "table of sparse", "table of linear"]
    assert cli.main(["--suite", "linear", "--device", "cpu", "--full"]) == 0
    assert "about 23 minutes" in capsys.readouterr().err


def test_make_lab_is_headless_and_honours_port():
    lab = " ".join(_make_recipe("lab"))
    assert "--no-browser" in lab and "$(PORT)" in lab and "$(LAB_FLAGS)" in lab
    flags = re.search(r"^LAB_FLAGS\s*:?=\s*(.*)$", (ROOT / "Makefile").read_text(), re.M).group(1).split()
    assert "--ServerApp.root_dir=." in flags          # lessons link to ../exercises/: serve the root
    settings = next(f.split("=", 1)[1] for f in flags if f.startswith("--LabApp.app_settings_dir="))
    assert (ROOT / settings / "overrides.json").is_file()


def test_readme_gives_the_two_commands_and_the_other_routes():
    readme = (ROOT / "README.md").read_text()
    assert "make lab" in readme and "make test" in readme
    assert "environment.yml" in readme and "Colab" in readme
    # set-up: what the torch pin installs per platform, and the variable that picks the index
    assert "TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in readme
    for platform in ("Linux x86_64", "macOS", "Windows", "Colab", "CUDA 13", "triton==3.7.1"):
        assert platform in readme, platform
    assert "make test-portable" in readme and "ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1" in readme
    for stem in ["01_scaled_dot_product_attention", "02_multi_head_attention", "08_flash_attention_tiling"]:
        assert stem in readme or stem[3:].replace("_", " ") in readme.lower()


def test_ci_runs_make_test():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci
    assert (ROOT / ".ci" / "run").stat().st_mode & 0o111, ".ci/run must be executable"


def test_import_works_from_the_checkouts_parent_folder(tmp_path):
    """Issue 23 (newcomer P12): the checkout is named like the package, so from its parent folder
    ``attn_course`` is also a directory without ``__init__.py`` there. The install (editable_mode=compat: a
    path entry, not a meta-path finder) must still give the real package, not an empty namespace."""
    (tmp_path / "attn_course").symlink_to(ROOT, target_is_directory=True)
    res = subprocess.run([sys.executable, "-c", "from attn_course import attention; import attn_course; "
                          "print(attn_course.__file__)"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().endswith("__init__.py")


def test_make_checks_the_python_first_and_never_reuses_another_pythons_venv(tmp_path, monkeypatch, capsys):
    """Review 2026-11-26 (learner §4): `make lab PYTHON=python3.9` ended after 33 s in pip's "no matching
    distribution for torch==2.13.0", and the half-built .venv (3.9) was silently reused by the next run with 3.11."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("check_python", ROOT / "tools" / "check_python.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    # the Makefile runs it before the venv is made, on every run (an order-only phony prerequisite)
    make = (ROOT / "Makefile").read_text()
    assert re.search(r"^\$\(VENV\)/\.torch:\s*\|\s*python-check\s*$", make, re.M)
    assert _make_recipe("python-check") == ["@$(PYTHON) tools/check_python.py $(VENV)"]
    here = sys.version_info[:2]
    venv = tmp_path / ".venv"
    assert mod.main(["x", str(venv)]) == 0                               # no venv yet, a supported Python
    venv.mkdir()
    (venv / "pyvenv.cfg").write_text(f"home = /usr/bin\nversion = {here[0]}.{here[1]}.7\n")
    assert mod.main(["x", str(venv)]) == 0                               # made by this Python: reused
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.9.18\n")
    assert mod.main(["x", str(venv)]) == 1
    err = capsys.readouterr().err
    assert "made by Python 3.9" in err and "make clean && make lab" in err and "PYTHON=python3.9" in err
    for old in ((3, 9), (3, 15)):                                        # torch 2.13.0 has cp310..cp314 wheels
        monkeypatch.setattr(sys, "version_info", (*old, 0, "final", 0))
        assert mod.main(["x", str(tmp_path / "none")]) == 1
        err = capsys.readouterr().err
        assert f"This Python is {old[0]}.{old[1]}" in err and "3.10 to 3.14" in err and "make lab PYTHON=" in err
    # and the real thing: a run of the script by the interpreter make would use
    res = subprocess.run([sys.executable, str(ROOT / "tools" / "check_python.py"), str(venv)], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 1 and "is not reused" in res.stderr
