"""Every shipped gin config parses against the binaries' configurables.

A config is only read when its binary starts, so a renamed parameter or a broken include
would otherwise surface in a researcher's run, not here."""

import glob
import importlib
import os

import gin
import pytest

from hogrod import harness

# every module under experiments/ (the binaries, experiments/bench/ and the shared models)
_EXPERIMENTS = os.path.join(harness.REPO_ROOT, "experiments")
BINARIES = sorted(os.path.splitext(os.path.relpath(p, _EXPERIMENTS))[0].replace(os.sep, ".")
                  for p in glob.glob(os.path.join(_EXPERIMENTS, "**", "*.py"), recursive=True)
                  if not p.endswith("__init__.py"))
# the shipped configs (hogrod/configs/), named as from the repository root (configs/...)
CONFIGS = sorted("configs/" + os.path.relpath(p, harness.CONFIG_DIR).replace(os.sep, "/")
                 for p in glob.glob(os.path.join(harness.CONFIG_DIR, "**", "*.gin"),
                                    recursive=True))


@pytest.fixture(scope="module", autouse=True)
def configurables():
    for name in BINARIES:  # registers every @gin.configurable a config may bind
        importlib.import_module(f"experiments.{name}")
    yield
    gin.clear_config()  # the last config's bindings would reach later tests' calls


@pytest.mark.parametrize("path", CONFIGS)
def test_config_parses(path):
    harness.parse_config([path], [])
    assert gin.config_str() or path.startswith("configs/strategy/")


def test_there_are_configs():
    assert len(CONFIGS) > 50 and "configs/maml/sinusoid_maml.gin" in CONFIGS
    assert {"bench.hvp", "bench.scaling", "hessian_spectrum", "models"} <= set(BINARIES)


def test_a_misspelt_binding_is_caught():
    with pytest.raises(Exception, match="No configurable matching 'maml_experimnt'"):
        harness.parse_config(["configs/maml/sinusoid_maml.gin"],
                             ["maml_experimnt.seed = 1"])


_SHARED = {"experiments", "experiments.models", "experiments.bench", "experiments.bench.timing",
           "experiments.bench.runs"}


def test_no_binary_imports_another_binary():
    """Binaries share code only through experiments.models, experiments.bench.timing and
    experiments.bench.runs."""
    import ast
    found = set()
    for name in BINARIES:
        path = os.path.join(_EXPERIMENTS, *name.split(".")) + ".py"
        with open(path) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                modules = ([f"{node.module}.{a.name}" for a in node.names]  # submodules
                           if node.module in ("experiments", "experiments.bench")
                           else [node.module])
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            else:
                continue
            found |= {(name, m) for m in modules
                      if m.split(".")[0] == "experiments" and m not in _SHARED}
    assert not found, sorted(found)
