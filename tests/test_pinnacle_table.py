"""The PINNacle table driver's aggregation, the seed statistics it shares with the DeepXDE
peer benchmark, and the check that a DeepXDE peer poses hogrod's problem (on stand-ins for
DeepXDE's objects: deepxde is only in the `bench` extra)."""

import json
import os
import types

import numpy as np
import pytest

from experiments.bench import peers, pinnacle_table, runs
from hogrod import pinn


def test_seed_stats_and_agreement_against_numpy():
    v = [0.3, 0.1, 0.25]
    s = runs.seed_stats(v)
    assert s["mean"] == pytest.approx(np.mean(v), rel=1e-15)
    assert s["std"] == pytest.approx(np.std(v, ddof=1), rel=1e-14)
    assert (s["min"], s["max"], s["n"]) == (0.1, 0.3, 3)
    assert runs.seed_stats([2.0])["std"] == 0.0
    sd = np.std(v, ddof=1)
    assert runs.agree_within_spread(v, [np.mean(v) + 0.9 * sd] * 3)
    assert not runs.agree_within_spread(v, [np.mean(v) + 1.1 * sd] * 3)
    with pytest.raises(ValueError, match="finite"):
        runs.seed_stats([1.0, float("nan")])


def _fake_run(run_dir, l2re, seconds, steps, seed):
    os.makedirs(run_dir)
    with open(os.path.join(run_dir, "metrics.json"), "w") as f:
        json.dump({"l2re": l2re, "total_seconds": seconds}, f)
    with open(os.path.join(run_dir, "config.gin"), "w") as f:
        f.write(f"pinn_experiment.adam_steps = {steps}\npinn_experiment.seed = {seed}\n")


def test_table_aggregates_finished_runs(tmp_path):
    # finished runs (metrics.json) are kept, not re-run: the table is their numbers
    vanilla, best = [0.5, 0.7], [0.1, 0.12]
    for k, seed in enumerate((0, 1)):
        _fake_run(tmp_path / "wave1d_c" / "vanilla" / f"seed{seed}", vanilla[k], 10.0 + k, 2,
                  seed)
        _fake_run(tmp_path / "wave1d_c" / "best" / f"seed{seed}", best[k], 30.0, 2, seed)
    out = pinnacle_table.pinnacle_table(str(tmp_path), cases=("wave1d_c",),
                                        methods={"vanilla": "", "best": "_best"},
                                        seeds=(0, 1), iterations=2)
    row = json.load(open(tmp_path / "table.json"))["table"]["wave1d_c"]
    assert row == out["table"]["wave1d_c"]
    assert row["vanilla"]["l2re"]["mean"] == pytest.approx(0.6, rel=1e-15)
    assert row["vanilla"]["l2re"]["std"] == pytest.approx(np.std(vanilla, ddof=1), rel=1e-14)
    assert row["best"]["l2re"]["mean"] == pytest.approx(0.11, rel=1e-15)
    assert row["ratio"]["best"] == pytest.approx(0.6 / 0.11, rel=1e-14)
    assert row["vanilla"]["train_seconds"]["mean"] == pytest.approx(10.5, rel=1e-15)
    text = open(tmp_path / "table.md").read()
    assert "| wave1d_c | 0.6 +- 0.14 (2) | 0.11 +- 0.014 (2) | 5.45 | 10 | 30 |" in text


def test_table_refuses_a_finished_run_of_other_iterations(tmp_path):
    _fake_run(tmp_path / "wave1d_c" / "vanilla" / "seed0", 0.5, 1.0, 3, 0)
    with pytest.raises(ValueError, match="adam_steps"):
        pinnacle_table.pinnacle_table(str(tmp_path), cases=("wave1d_c",),
                                      methods={"vanilla": ""}, seeds=(0,), iterations=2)
    with pytest.raises(ValueError, match="no config"):
        pinnacle_table.pinnacle_table(str(tmp_path), cases=("wave1d_c",),
                                      methods={"vanilla": "", "x": "_nope"}, iterations=2)


class _BC:
    """A DeepXDE condition's stand-in: its cached target func(x, beg, end, aux) and
    filter(x) (the points on its piece)."""

    def __init__(self, target, piece):
        self.target, self.piece = target, piece

    def func(self, x, beg, end, aux):
        return self.target(x[beg:end])

    def filter(self, x):
        return x[self.piece(x)]


def _wave_stand_in(a=4, t_max=1.0, counts=(512, 512, 1024)):
    """DeepXDE's Wave1D data as PINNacle builds it, written with numpy from PINNacle's
    definition (bottom side t = 0, sides x = 0, 1)."""
    rng = np.random.default_rng(0)
    on_t0 = lambda x: np.isclose(x[:, 1], 0)                            # noqa: E731
    on_x01 = lambda x: np.isclose(x[:, 0], 0) | np.isclose(x[:, 0], 1)  # noqa: E731
    ref = lambda x: peers.pinnacle_wave1d_ref_sol(x, a)                # noqa: E731
    bottom = np.stack([rng.random(counts[0]), np.zeros(counts[0])], 1)
    sides = np.stack([rng.integers(0, 2, counts[2]).astype(float), rng.random(counts[2])], 1)
    inside = lambda x: ((x >= 0) & (x <= [1, t_max])).all(1)            # noqa: E731
    return types.SimpleNamespace(
        num_domain=8192, num_boundary=sum(counts), num_bcs=list(counts),
        train_x_bc=np.concatenate([bottom, bottom, sides]),
        bcs=[_BC(lambda x: 0.0, on_t0), _BC(ref, on_t0), _BC(ref, on_x01)],
        geom=types.SimpleNamespace(inside=inside))


WAVE_TERMS = [("initial_velocity", -1), ("initial", 1), ("boundary", 1)]
WAVE_COUNTS = {"initial_velocity": 512, "initial": 512, "boundary": 1024}


def test_deepxde_peer_check_accepts_the_same_wave_and_names_each_difference():
    prob = pinn.pinnacle.pinnacle_wave1d(test_points=100)
    check = lambda data, counts=WAVE_COUNTS, n=8192, sol=peers.pinnacle_wave1d_ref_sol: (  # noqa
        peers.check_deepxde_peer(data, prob, WAVE_TERMS, n, counts, "wave1d_c.gin", sol))
    check(_wave_stand_in())
    with pytest.raises(ValueError, match="n_collocation"):
        check(_wave_stand_in(), n=4096)
    with pytest.raises(ValueError, match="'initial' 400 points"):
        check(_wave_stand_in(counts=(512, 400, 1136)))
    with pytest.raises(ValueError, match="domains differ"):
        check(_wave_stand_in(t_max=2.0))
    with pytest.raises(ValueError, match="'initial': DeepXDE's target"):
        check(_wave_stand_in(a=3))
    with pytest.raises(ValueError, match="solution"):
        check(_wave_stand_in(), sol=lambda x: peers.pinnacle_wave1d_ref_sol(x, 3))


def test_deepxde_glorot_normal_differs_by_layer_and_seed():
    # DeepXDE calls the initializer once per layer: same-shaped layers must differ, seeds
    # must differ, a seed must reproduce, and the scale is Glorot's sqrt(2 / (in + out))
    draw = lambda init: np.asarray(init((100, 100)))  # noqa: E731
    a = peers.deepxde_glorot_normal(0)
    first, second = draw(a), draw(a)
    assert np.abs(first - second).max() > 0.1
    assert np.abs(first - draw(peers.deepxde_glorot_normal(1))).max() > 0.1
    np.testing.assert_array_equal(first, draw(peers.deepxde_glorot_normal(0)))
    assert np.std(np.concatenate([first, second])) == pytest.approx(0.1, rel=0.05)
