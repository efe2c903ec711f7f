"""The wheel as a user installs it: built from a copy of the sources, installed into a fresh
virtual environment, run from a directory that is not the repository.

Oracles: the wheel's file list (only `hogrod/` and its metadata; every package under
hogrod/ and every shipped config in it; no benchmark, no benchmark config), its console
scripts (no `hogrod-bench-*`), and a console command run with a shipped config.
"""

import configparser
import glob
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest

from conftest import REPO_ROOT


def _run(argv, **kw):
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, **kw)
    assert out.returncode == 0, f"{' '.join(map(str, argv))}:\n{out.stdout[-2000:]}\n" \
                                f"{out.stderr[-3000:]}"
    return out


def _build_wheel(tmp_path):
    # A copy, so an in-tree build leaves nothing in the checkout and a stale build/ there
    # cannot put deleted files into the wheel.
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for name in ("hogrod", "experiments"):
        shutil.copytree(os.path.join(REPO_ROOT, name), src / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(REPO_ROOT, name), src / name)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
          "--no-index", "-q", "-w", str(tmp_path / "dist"), str(src)])
    (wheel,) = glob.glob(str(tmp_path / "dist" / "hogrod-*.whl"))
    return wheel


def _clean_env():
    # nothing but the venv's own site-packages (and the .pth below): no checkout on
    # PYTHONPATH, whose hogrod would be imported, or seen by pip as installed already
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME",
                                                               "HOGROD_DATA",
                                                               "TF_CPP_MIN_LOG_LEVEL")}
    return dict(env, PYTHONNOUSERSITE="1")


def _venv(tmp_path, wheel):
    """A venv without pip; the wheel installed by this interpreter's pip run as the venv's
    interpreter (`pip --python`: scripts and files land in the venv); then a .pth file that
    adds this interpreter's site-packages (TensorFlow and the other dependencies) after the
    venv's own."""
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
          "--no-index", "-q", wheel], env=_clean_env())
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                env=_clean_env()).stdout.strip()
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    with open(os.path.join(site, "_hogrod_test_dependencies.pth"), "w") as f:
        f.write("\n".join(sorted(ours)) + "\n")
    return venv, site


@pytest.mark.slow
def test_the_wheel_installs_hogrod_alone_and_its_commands_run_from_anywhere(tmp_path):
    wheel = _build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        info = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        entry_points = configparser.ConfigParser()
        entry_points.read_string(z.read(info).decode())
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"hogrod"}, tops
    assert not [n for n in names if "/bench/" in n or n.endswith("/bench")], "benchmarks ship"
    packages = {os.path.relpath(os.path.dirname(p), REPO_ROOT).replace(os.sep, "/")
                for p in glob.glob(os.path.join(REPO_ROOT, "hogrod", "**", "__init__.py"),
                                   recursive=True)}
    missing = {p for p in packages if f"{p}/__init__.py" not in names}
    assert not missing, f"packages not listed in pyproject.toml's [tool.setuptools]: {missing}"
    configs = {os.path.relpath(p, REPO_ROOT).replace(os.sep, "/")
               for p in glob.glob(os.path.join(REPO_ROOT, "hogrod", "configs", "**", "*.gin"),
                                  recursive=True)}
    assert configs and configs <= set(names)
    assert {"hogrod/py.typed", "hogrod/models.py", "hogrod/experiments/__init__.py",
            "hogrod/experiments/maml.py"} <= set(names)
    scripts = dict(entry_points["console_scripts"])
    assert scripts["hogrod-maml"] == "hogrod.experiments.maml:main"
    assert not [s for s in scripts if s.startswith("hogrod-bench")], scripts

    venv, site = _venv(tmp_path, wheel)
    assert not glob.glob(str(venv / "bin" / "hogrod-bench*"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = _clean_env()
    probe = _run([str(venv / "bin" / "python"), "-c",  # find_spec: no TensorFlow import
                  "import importlib.util as u, json; print(json.dumps([u.find_spec('hogrod')"
                  ".origin, u.find_spec('experiments') is None]))"], cwd=elsewhere, env=env)
    location, no_experiments = json.loads(probe.stdout)
    assert location.startswith(site) and no_experiments, probe.stdout

    out = _run([str(venv / "bin" / "hogrod-maml"), "--gin_file=maml/sinusoid_maml.gin",
                "--gin_param=maml_experiment.meta_iterations = 2",
                "--gin_param=maml_experiment.eval_steps = (0, 1)",
                "--gin_param=sinusoid_data.meta_batch_size = 2",
                "--gin_param=sinusoid_data.eval_tasks = 4",
                "--gin_param=sinusoid_data.eval_k_query = 5", "--output_dir=run"],
               cwd=elsewhere, env=env)
    metrics = json.loads((elsewhere / "run" / "metrics.json").read_text())
    assert metrics["meta_iterations"] == 2, metrics
    assert "writing outputs to" in out.stderr  # absl INFO lines pass the filter
    # the start-up noise filter: TensorFlow's notices and the per-checkpoint lines dropped
    assert "Could not find cuda drivers" not in out.stderr
    assert "absl::InitializeLog" not in out.stderr
    assert "Sharding callback duration" not in out.stderr


def test_only_a_binary_filters_tensorflows_start_up_noise():
    """A console command or `python -m` of an experiment drops TF's start-up notices; any
    other program importing hogrod (a test, a user's script or package) keeps its stderr."""
    from hogrod.stderr_filter import started_as_binary
    assert started_as_binary(["/venv/bin/hogrod-maml"], ["python", "/venv/bin/hogrod-maml"])
    assert started_as_binary(["-m"], ["python", "-m", "experiments.maml", "--gin_file=a.gin"])
    assert started_as_binary(["-m"], ["python", "-u", "-m", "hogrod.experiments.pinn"])
    assert not started_as_binary(["-m"], ["python", "-m", "pytest", "-q"])
    assert not started_as_binary(["-m"], ["python", "-m", "mine.experiments.run"])
    assert not started_as_binary(["train.py"], ["python", "train.py", "-m", "experiments.x"])
