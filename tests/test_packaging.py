"""Packaging: the wheel installs and works outside the repository; the editable install maps the folders.

The top-level folders envs/ rewards/ problems/ training/ are subpackages of kb_gym through a
package-dir mapping, and the built-in problem files are package data; both have to survive a
wheel build, which the editable install used for development would not notice.
"""

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import kb_gym.rewards

REPO = Path(__file__).resolve().parents[1]
SUBCOMMANDS = ("demo", "eval", "baseline", "report")

CHECK_SCRIPT = """
import kb_gym, kb_gym.envs, kb_gym.rewards, kb_gym.problems, kb_gym.training
from kb_gym.problems import load_problems
print(kb_gym.__file__)
print(kb_gym.rewards.__file__)
print(len(load_problems("builtin")))
import gymnasium, torch
print(torch.__file__)
"""


def _clean_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _copy_source(dest: Path) -> Path:
    """The repository without .git, the venv and build outputs, so building never writes into the repo."""
    ignore = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__",
                                    ".pytest_cache", ".ruff_cache", ".whl", ".device")
    shutil.copytree(REPO, dest, ignore=ignore, symlinks=True)
    return dest


@pytest.mark.slow
def test_wheel_installs_and_works(tmp_path):
    src = _copy_source(tmp_path / "src")
    dist = tmp_path / "dist"
    # --skip-dependency-check: setuptools>=70.1 builds wheels itself; the project venv need not hold `wheel`.
    build = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--skip-dependency-check",
                            "--outdir", str(dist)], cwd=src, capture_output=True, text=True, timeout=300, env=_clean_env())
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    wheels = list(dist.glob("kb_gym-*.whl"))
    assert len(wheels) == 1, wheels
    wheel = wheels[0]

    names = zipfile.ZipFile(wheel).namelist()
    assert "kb_gym/problems/builtin/level1/1_ReLU.py" in names
    assert "kb_gym/rewards/__init__.py" in names
    for sub in ("envs", "problems", "training", "worker"):
        assert f"kb_gym/{sub}/__init__.py" in names, sub
    builtin = len(list((REPO / "problems" / "builtin").glob("level*/*.py")))
    assert sum(n.startswith("kb_gym/problems/builtin/level") for n in names) == builtin
    assert not [n for n in names if n.startswith("tests/") or "/tests/" in n]
    assert not [n for n in names if n.split("/", 1)[0] in ("envs", "rewards", "problems", "training")]

    # A throwaway venv with no pip: install the wheel with the project's pip, --target its site-packages.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True, cwd=tmp_path,
                               env=_clean_env()).stdout.strip())
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile",
                              "--disable-pip-version-check", "--target", str(site), str(wheel)],
                             capture_output=True, text=True, timeout=300, env=_clean_env())
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]

    # Dependencies come from the project venv. A path listed in a .pth joins sys.path, but the .pth
    # files inside it are not processed, so the project's editable kb_gym finder stays inactive.
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8")

    run = subprocess.run([str(python), "-c", CHECK_SCRIPT], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path, env={**_clean_env(), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    kb_file, rewards_file, count, torch_file = run.stdout.strip().splitlines()[-4:]
    assert Path(kb_file).resolve().is_relative_to(site.resolve()), kb_file
    assert Path(rewards_file).resolve() == (site / "kb_gym" / "rewards" / "__init__.py").resolve()
    assert not Path(kb_file).resolve().is_relative_to(REPO)
    assert count == str(builtin)
    assert Path(torch_file).resolve().is_relative_to(Path(sysconfig.get_paths()["purelib"]).resolve())


def test_editable_install_maps_the_folders():
    assert Path(kb_gym.rewards.__file__).resolve().is_relative_to(REPO / "rewards")


def test_console_script_help():
    script = Path(sys.executable).parent / ("kb-gym.exe" if os.name == "nt" else "kb-gym")
    if not script.exists():
        pytest.skip(f"no kb-gym console script next to {sys.executable}")
    proc = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for sub in SUBCOMMANDS:
        assert sub in proc.stdout, f"{sub} missing from kb-gym --help:\n{proc.stdout}"
