"""hogrod's benchmark binaries, run from the repository root (never installed):

    python -m experiments.bench.NAME --gin_file=experiments/bench/configs/NAME.gin

Each times hogrod against a peer (JAX, PyTorch, DeepXDE, plain eager TF2) or a floor after
checking that both compute the same thing: each side against a float64 reference, within
float32's rounding of that computation (`peers.Reference`). What they share: `timing` (the
interleaved-rounds timer and the matmul floor), `runs` (binaries in subprocesses, seed
statistics) and `peers` (the agreement check, the ridge hyperproblem, the DeepXDE peers,
the torch MAML network); models and losses come from `hogrod.models`. Their configs are
`experiments/bench/configs/NAME.gin`, beside them, and `NAME_smoke.gin` for each: the same
run at small sizes, in seconds (tests/test_bench_smoke.py runs every one).

The peers come with the `bench` extra, pinned to the versions the ratios were measured
against; torch's CPU build first (the package index serves a CUDA build under the same
version, other kernels), then the extra:

    pip install torch==2.13.0 --index-url CPU_INDEX   # PyTorch's CPU wheel index (its
    pip install -e '.[bench]'                          # install selector's "CPU" line)

(or `--find-links DIR` with the CPU wheel in DIR; where pip already finds a local CPU wheel,
as on the project's machines, plain `pip install torch==2.13.0` takes it). Check that
`python -c "import torch; print(torch.__version__)"` prints 2.13.0+cpu.

kfac-jax (the K-FAC benchmark's peer) needs jax 0.9.0: its own environment, `pip install
kfac-jax==0.0.8 'jax[cpu]==0.9.0'`, named by `bench_kfac.kfac_jax_python`. A peer that is
not installed is skipped (logged) and its metrics are None; hogrod's side still runs.
"""

if __name__ != "experiments.bench":  # an editable install also reaches the folder by another name
    raise ImportError(f"the benchmarks run from the repository root as experiments.bench, not as "
                      f"{__name__}: python -m experiments.bench.NAME "
                      f"--gin_file=experiments/bench/configs/NAME.gin")
