"""Draw several `experiments/hyperopt.py` runs (one per hypergradient method) in one figure:

    python -m experiments.hyperopt_compare OUT_DIR RUN_DIR [RUN_DIR ...]

writes OUT_DIR/compare_loss.png (validation and test loss against outer steps) and
OUT_DIR/compare_hypergradient.png (each method's cosine and relative error to the exact
hypergradient), each curve labelled by its run's method.
"""

import sys

from absl import app

from experiments.hyperopt import plot_compare


def _main(argv):
    if len(argv) < 3:
        raise app.UsageError("usage: python -m experiments.hyperopt_compare OUT_DIR RUN_DIR "
                             "[RUN_DIR ...]")
    for path in plot_compare(argv[2:], argv[1]):
        print(path)


def main():
    app.run(_main)


if __name__ == "__main__":
    sys.exit(main())
