"""Every shipped gin config parses against the binaries' configurables.

A config is only read when its binary starts, so a renamed parameter or a broken include
would otherwise surface in a researcher's run, not here."""

import glob
import importlib
import os

import gin
import pytest

from hogrod import harness

BINARIES = [os.path.splitext(os.path.basename(p))[0]
            for p in glob.glob(os.path.join(harness.REPO_ROOT, "experiments", "*.py"))
            if not p.endswith("__init__.py")]
CONFIGS = sorted(os.path.relpath(p, harness.REPO_ROOT)
                 for p in glob.glob(os.path.join(harness.REPO_ROOT, "configs", "**", "*.gin"),
                                    recursive=True))


@pytest.fixture(scope="module", autouse=True)
def configurables():
    for name in BINARIES:  # registers every @gin.configurable a config may bind
        importlib.import_module(f"experiments.{name}")


@pytest.mark.parametrize("path", CONFIGS)
def test_config_parses(path):
    harness.parse_config([path], [])
    assert gin.config_str() or path.startswith("configs/strategy/")


def test_a_misspelt_binding_is_caught():
    with pytest.raises(Exception, match="No configurable matching 'maml_experimnt'"):
        harness.parse_config(["configs/maml/sinusoid_maml.gin"],
                             ["maml_experimnt.seed = 1"])
