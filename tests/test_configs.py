"""Every shipped gin config parses against the binaries' configurables.

A config is only read when its binary starts, so a renamed parameter or a broken include
would otherwise surface in a researcher's run, not here."""

import glob
import importlib
import os
import re

import gin
import pytest

from hogrod import bindings, harness

# every module under experiments/ (the binaries and experiments/bench/), as from the
# repository root
_EXPERIMENTS = os.path.join(harness.REPO_ROOT, "experiments")
BINARIES = sorted(os.path.splitext(os.path.relpath(p, _EXPERIMENTS))[0].replace(os.sep, ".")
                  for p in glob.glob(os.path.join(_EXPERIMENTS, "**", "*.py"), recursive=True)
                  if not p.endswith("__init__.py"))
# the shipped configs (hogrod/configs/), named as from the repository root (configs/...)
CONFIGS = sorted("configs/" + os.path.relpath(p, bindings.CONFIG_DIR).replace(os.sep, "/")
                 for p in glob.glob(os.path.join(bindings.CONFIG_DIR, "**", "*.gin"),
                                    recursive=True))
# the benchmarks' configs, beside them (not shipped)
_BENCH_CONFIGS = os.path.join(_EXPERIMENTS, "bench", "configs")
BENCH_CONFIGS = sorted(os.path.relpath(p, harness.REPO_ROOT).replace(os.sep, "/")
                       for p in glob.glob(os.path.join(_BENCH_CONFIGS, "*.gin")))


@pytest.fixture(scope="module", autouse=True)
def configurables():
    importlib.import_module("hogrod.models")  # `@mlp`, `@conv4`
    for name in BINARIES:  # registers every @gin.configurable a config may bind
        importlib.import_module(f"experiments.{name}")
    yield
    gin.clear_config()  # the last config's bindings would reach later tests' calls


@pytest.mark.parametrize("path", CONFIGS + BENCH_CONFIGS)
def test_config_parses(path):
    harness.parse_config([os.path.join(harness.REPO_ROOT, path)
                          if path.startswith("experiments/") else path], [])
    assert gin.config_str() or path.startswith("configs/strategy/")


def test_there_are_configs():
    assert len(CONFIGS) > 50 and "configs/maml/sinusoid_maml.gin" in CONFIGS
    assert {"bench.hvp", "bench.scaling", "bench.peers", "hessian_spectrum"} <= set(BINARIES)
    assert not any(c.startswith("configs/bench/") for c in CONFIGS)  # benchmarks: not shipped
    assert len(BENCH_CONFIGS) >= 15 and "experiments/bench/configs/hvp.gin" in BENCH_CONFIGS
    # every benchmark config is its binary's, `python -m experiments.bench.NAME
    # --gin_file=experiments/bench/configs/NAME.gin` (or NAME_<variant>.gin, another problem
    # of the same binary: maml_omniglot.gin)
    def binary_of(config):
        name = os.path.basename(config)[:-4]
        return next((b for b in BINARIES if b.startswith("bench.") and
                     (name == b[6:] or name.startswith(b[6:] + "_"))), None)
    assert [c for c in BENCH_CONFIGS if binary_of(c) is None] == []
    assert binary_of("experiments/bench/configs/maml_omniglot.gin") == "bench.maml"
    assert binary_of("experiments/bench/configs/nobinary.gin") is None


_DATA_PATH = re.compile(r"""=\s*['"][^'"]*(\.\./|/data/|shared)""")


def test_no_shipped_config_binds_a_data_path():
    """A path in a shipped config means nothing where the package is installed: data are
    found through a binding the user gives or HOGROD_DATA."""
    found = []
    for path in CONFIGS:
        with open(os.path.join(harness.PACKAGE_DIR, path)) as f:
            found += [f"{path}: {line.strip()}" for line in f
                      if not line.lstrip().startswith("#") and _DATA_PATH.search(line)]
    assert not found, found


def test_a_misspelt_binding_is_caught():
    with pytest.raises(Exception, match="No configurable matching 'maml_experimnt'"):
        harness.parse_config(["configs/maml/sinusoid_maml.gin"],
                             ["maml_experimnt.seed = 1"])


def _imports(path):
    """Every module a file imports, absolute (a relative import resolved in `experiments`)."""
    import ast
    package = "experiments." + os.path.dirname(os.path.relpath(path, _EXPERIMENTS)).replace(
        os.sep, ".")
    with open(path) as f:
        tree = ast.parse(f.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.rstrip(".").split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            yield from [f"{base}.{a.name}" for a in node.names]  # submodules and names
            yield base
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names)


# what the benchmarks share (they run from the repository, as experiments.bench)
_BENCH_SHARED = ("experiments.bench.timing", "experiments.bench.runs", "experiments.bench.peers")


def test_no_binary_imports_another_binary():
    """The installed binaries (experiments/*.py, `hogrod.experiments` once installed) import
    `hogrod.*` only, never `experiments` by either name: shared models and losses are
    `hogrod.models`. Benchmarks share only experiments.bench.timing, .runs and .peers; a
    benchmark may split its own peer into `experiments/bench/<its name>_*.py`."""
    found = set()
    for name in BINARIES:
        bench = name.startswith("bench.")
        for module in _imports(os.path.join(_EXPERIMENTS, *name.split(".")) + ".py"):
            top = module.split(".")
            if top[0] == "experiments" or top[:2] == ["hogrod", "experiments"]:
                own = f"experiments.{name}_"  # bench.pes -> experiments.bench.pes_jax
                if not (bench and (module in ("experiments", "experiments.bench")
                                   or module.startswith(_BENCH_SHARED + (own,)))):
                    found.add((name, module))
    assert not found, sorted(found)
