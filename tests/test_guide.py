"""The user guide cannot rot: every script in docs/guide/ runs (quick sizes) and passes its
own oracle assertions, and the guide and its scripts reference each other."""

import glob
import importlib.util
import os
import re

import pytest

from conftest import REPO_ROOT

GUIDE = os.path.join(REPO_ROOT, "docs", "guide.md")
SCRIPTS = sorted(glob.glob(os.path.join(REPO_ROOT, "docs", "guide", "*.py")))
_LOADED = {}


def _load(path):
    """Import a guide script once per session (gin refuses a configurable registered twice)."""
    if path not in _LOADED:
        name = "guide_" + os.path.splitext(os.path.basename(path))[0]
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _LOADED[path] = module
    return _LOADED[path]


def test_there_are_guide_scripts():
    assert len(SCRIPTS) >= 8, SCRIPTS


@pytest.mark.parametrize("path", SCRIPTS, ids=os.path.basename)
def test_guide_script_runs_quick(path):
    module = _load(path)
    assert callable(getattr(module, "main", None)), f"{path} must define main(quick=False)"
    module.main(quick=True)  # each script ends in assertions against an oracle


def test_guide_and_scripts_reference_each_other():
    with open(GUIDE) as f:
        text = f.read()
    named = set(re.findall(r"docs/guide/([A-Za-z0-9_]+\.(?:py|gin))", text))
    on_disk = {os.path.basename(p) for p in glob.glob(os.path.join(REPO_ROOT, "docs", "guide",
                                                                   "*.*"))}
    assert on_disk - named == set(), f"scripts the guide does not mention: {on_disk - named}"
    assert named - on_disk == set(), f"the guide names missing files: {named - on_disk}"
    for path in SCRIPTS:
        with open(path) as f:
            source = f.read()
        assert f"docs/guide/{os.path.basename(path)}" in source, (
            f"{path}'s docstring should show how to run it")


def test_readme_links_the_guide():
    with open(os.path.join(REPO_ROOT, "README.md")) as f:
        assert "docs/guide.md" in f.read()
