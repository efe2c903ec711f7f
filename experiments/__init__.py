"""hogrod's experiment binaries, installed as `hogrod.experiments`: `hogrod-NAME` from any
directory (pyproject.toml's [project.scripts]), or `python -m experiments.NAME` from the
repository root. They import `hogrod.*` only, never one another; shared models and losses
are `hogrod.models`. The benchmarks (`experiments/bench/`) run from the repository only.
"""

import sys

import hogrod  # noqa: F401  (first: a binary filters TF's start-up noise, hogrod.stderr_filter)

# `python -m experiments.NAME` from the checkout of an installed hogrod could import this
# folder under both names: every gin configurable would then be registered twice.
_OTHER = "hogrod.experiments" if __name__ == "experiments" else "experiments"
if getattr(sys.modules.get(_OTHER), "__file__", None) == __file__:
    raise ImportError(f"the experiments are already imported as {_OTHER}; import them under one "
                      f"name only ({_OTHER}.NAME), not also as {__name__}")
