"""hogrod's benchmark binaries: `python -m experiments.bench.NAME
--gin_file=configs/bench/NAME.gin` or the console command `hogrod-bench-NAME`.

Each times hogrod against a peer (JAX, PyTorch, DeepXDE, plain eager TF2) or a floor after
checking that both compute the same thing; `timing` holds the interleaved-rounds timer and
the matmul floor they share. Models and losses come from `experiments.models`.
"""
