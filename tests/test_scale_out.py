"""Scale-out (issue 8): one step of every family under MirroredStrategy over two logical
CPUs and under a two-process MultiWorkerMirroredStrategy equals the single-device step;
a checkpoint written by two replicas restores on one."""

import os
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import REPO_ROOT
from hogrod import distribute, gan, train
from scale_out_fixtures import FAMILIES, flat, mlp
from train_fixtures import GLOBAL_BATCH, make_problem, weights

_SINGLE = {}


def single(name):  # the oracle, computed once per family
    if name not in _SINGLE:
        _SINGLE[name] = FAMILIES[name](tf.distribute.get_strategy())
    return _SINGLE[name]


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_mirrored_step_equals_single_device(name):
    strategy = distribute.make_strategy("mirrored")
    assert strategy.num_replicas_in_sync == 2
    np.testing.assert_allclose(FAMILIES[name](strategy), single(name), atol=1e-5)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_step_moves_the_weights(name):  # so the equivalences compare something
    assert np.linalg.norm(single(name)) > 1e-3


def test_replicas_drawing_their_own_noise_are_not_the_single_device_step():
    """Without `gan.with_noise` each replica samples its own z and GP weights: the same
    distribution, other numbers; the equivalence test would catch that."""
    def step(strategy):
        with strategy.scope():
            keras.utils.set_random_seed(0)
            generator, critic = mlp(2, 2), mlp(2, 1)
            opts = [keras.optimizers.SGD(0.1) for _ in range(2)]
        fn = gan.make_wgan_gp_step(generator, critic, *opts, latent_dim=2, n_critic=1,
                                   strategy=strategy)
        data = iter(strategy.experimental_distribute_dataset(
            gan.toy_batches("eight_gaussians", 32, seed=0)))
        keras.utils.set_random_seed(1)
        fn((next(data),))
        return flat(critic.trainable_variables)

    assert np.abs(step(distribute.make_strategy("mirrored")) -
                  step(tf.distribute.get_strategy())).max() > 1e-4


def test_two_process_multi_worker_steps_equal_single_device(tmp_path):
    results = distribute.launch_local(
        [sys.executable, os.path.join(REPO_ROOT, "tests", "workers", "families.py"),
         str(tmp_path)], 2, timeout_s=400, cwd=REPO_ROOT, env={"PYTHONPATH": REPO_ROOT})
    assert all("DONE 2" in r.stdout for r in results)
    for name in sorted(FAMILIES):
        np.testing.assert_allclose(np.load(tmp_path / f"{name}.npy"), single(name), atol=1e-5,
                                   err_msg=name)


def test_checkpoint_from_two_replicas_resumes_on_one(tmp_path):
    def run(strategy, steps):
        with strategy.scope():
            model, opt, loss_fn, data = make_problem()
            opt = keras.optimizers.Adam(1e-2)
        step = train.make_train_step(loss_fn, opt, model.trainable_variables, strategy=strategy)
        ckpt = train.Checkpointer(str(tmp_path / "ckpt"), model=model, optimizer=opt)
        batches = iter(strategy.experimental_distribute_dataset(
            data.batch(GLOBAL_BATCH).repeat()))
        for _ in range(ckpt.restore()):  # skip the batches the restored steps used
            next(batches)
        train.train_loop(step, batches, steps, ckpt)
        return model, opt

    run(distribute.make_strategy("mirrored"), 3)  # two replicas, checkpoint at step 3
    resumed, opt = run(tf.distribute.get_strategy(), 5)  # one replica: steps 4 and 5
    assert int(opt.iterations) == 5
    model, opt, loss_fn, data = make_problem()  # the uninterrupted single-device run
    opt = keras.optimizers.Adam(1e-2)
    step = train.make_train_step(loss_fn, opt, model.trainable_variables)
    for b in data.batch(GLOBAL_BATCH).repeat().take(5):
        step(b)
    np.testing.assert_allclose(weights(resumed), weights(model), atol=1e-5)
