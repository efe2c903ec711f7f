"""hogrod's benchmark binaries, run from the repository root (never installed):

    python -m experiments.bench.NAME --gin_file=experiments/bench/configs/NAME.gin

Each times hogrod against a peer (JAX, PyTorch, DeepXDE, plain eager TF2) or a floor after
checking that both compute the same thing. What they share: `timing` (the interleaved-rounds
timer and the matmul floor), `runs` (binaries in subprocesses, seed statistics) and `peers`
(the ridge hyperproblem and the DeepXDE peers); models and losses come from `hogrod.models`.
Their configs are `experiments/bench/configs/NAME.gin`, beside them.
"""

if __name__ != "experiments.bench":  # an editable install also reaches the folder by another name
    raise ImportError(f"the benchmarks run from the repository root as experiments.bench, not as "
                      f"{__name__}: python -m experiments.bench.NAME "
                      f"--gin_file=experiments/bench/configs/NAME.gin")
