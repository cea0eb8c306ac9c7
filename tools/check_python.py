"""Run by ``make`` with the Python it will build ``.venv/`` from (``make lab PYTHON=python3.12``), before anything
is installed: is it a Python that torch 2.13.0 has wheels for, and, if ``.venv/`` already exists, was it made by
this same Python? Exit 0, or print what to do and exit 1. Kept runnable by old Pythons (macOS ships 3.9)."""
import os
import sys

# torch 2.13.0 publishes wheels for CPython 3.10 to 3.14 (cp310 ... cp314); pyproject.toml asks for >= 3.10
LOWEST, HIGHEST = (3, 10), (3, 14)


def venv_version(venv):
    """(major, minor) of the Python that made ``venv`` (its pyvenv.cfg), or None where there is no venv."""
    cfg = os.path.join(venv, "pyvenv.cfg")
    if not os.path.isfile(cfg):
        return None
    with open(cfg) as f:
        for line in f:
            key, _, value = line.partition("=")
            if key.strip() in ("version", "version_info"):
                return tuple(int(x) for x in value.strip().split(".")[:2])
    return None


def main(argv):
    venv = argv[1] if len(argv) > 1 else ".venv"
    here = sys.version_info[:2]
    name = "%d.%d" % here
    if not LOWEST <= here <= HIGHEST:
        print("This Python is %s (%s); the course needs Python 3.10 to 3.14 (torch 2.13.0 has wheels only for those).\n"
              "Install one (python.org, Homebrew `brew install python@3.12`, or your package manager) and name it:\n"
              "    make lab PYTHON=python3.12" % (name, sys.executable), file=sys.stderr)
        return 1
    made_by = venv_version(venv)
    if made_by is not None and made_by != here:
        print("%s/ was made by Python %d.%d, but this make runs Python %s (%s): it is not reused.\n"
              "Either start again with this Python:    make clean && make lab\n"
              "or keep the old one:                    make lab PYTHON=python%d.%d"
              % (venv, made_by[0], made_by[1], name, sys.executable, made_by[0], made_by[1]), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
