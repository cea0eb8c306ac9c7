"""Packaging: environment.yml and pyproject.toml list the same dependencies; torch pin; Makefile; README."""
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
TESTED_TORCH = "2.13.0"


def _pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _pyproject_requirements(extras=("lab", "dev", "triton")) -> dict[str, Requirement]:
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
    py, env = _pyproject_requirements(), _environment_pip_requirements()
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


def test_environment_installs_the_package_and_a_supported_python():
    text = (ROOT / "environment.yml").read_text()
    assert re.search(r"^\s*-\s*-e\s+\.\s*$", text, re.M), "environment.yml must pip-install the course (-e .)"
    py_env = re.search(r"^\s*-\s*python\s*([<>=!~].*)$", text, re.M)
    assert py_env and py_env.group(1).strip() == _pyproject()["project"]["requires-python"]


def test_console_script_and_package_data():
    proj = _pyproject()["project"]
    assert proj["scripts"]["attn-course"] == "attn_course.grading.cli:main"
    assert {"lab", "dev", "triton"} <= set(proj["optional-dependencies"])


def _make_recipe(target: str) -> list[str]:
    lines = (ROOT / "Makefile").read_text().splitlines()
    start = next(i for i, l in enumerate(lines) if re.match(rf"^{re.escape(target)}\s*:", l))
    recipe = []
    for l in lines[start + 1:]:
        if not l.startswith("\t"):
            break
        recipe.append(l.strip())
    return recipe


def test_makefile_installs_tested_torch_before_the_package():
    recipe = _make_recipe("$(VENV)/.installed")
    torch_line = next(i for i, l in enumerate(recipe) if f"torch=={TESTED_TORCH}" in l)
    pkg_line = next(i for i, l in enumerate(recipe) if re.search(r"pip install .*-e \"?\.\[lab,dev,triton\]", l))
    assert torch_line < pkg_line
    for target in ("lab", "test"):
        deps = re.search(rf"^{target}\s*:(.*)$", (ROOT / "Makefile").read_text(), re.M).group(1)
        assert "setup" in deps.split(), f"make {target} must create the environment first"


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
    for stem in ["01_scaled_dot_product_attention", "02_multi_head_attention", "08_flash_attention_tiling"]:
        assert stem in readme or stem[3:].replace("_", " ") in readme.lower()


def test_ci_runs_make_test():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci
    assert (ROOT / ".ci" / "run").stat().st_mode & 0o111, ".ci/run must be executable"
