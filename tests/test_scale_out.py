"""Scale-out: one step of every family under MirroredStrategy over two logical
CPUs and under a two-process MultiWorkerMirroredStrategy equals the single-device step;
a checkpoint written by two replicas restores on one."""

import fcntl
import os
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import REPO_ROOT, bench_config
from hogrod import distribute, gan, train
from scale_out_fixtures import FAMILIES, flat, gan_step, mlp
from train_fixtures import GLOBAL_BATCH, make_problem, weights


@pytest.fixture(scope="session")
def single(tmp_path_factory):
    """single(name): the oracle, one family's single-device result, computed once per test
    run and shared by the pytest-xdist workers through a file (computing every family
    takes about 20 CPU-s); a lock makes a worker wait for one another is computing."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the workers' common base directory

    def result(name):
        path = shared / f"scale_out_single_{name}.npy"
        with open(f"{path}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not path.exists():
                np.save(path, FAMILIES[name](tf.distribute.get_strategy()))
        return np.load(path)
    return result


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_mirrored_step_equals_single_device(name, single):
    strategy = distribute.make_strategy("mirrored")
    assert strategy.num_replicas_in_sync == 2
    np.testing.assert_allclose(FAMILIES[name](strategy), single(name), atol=1e-5)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_step_moves_the_weights(name, single):  # so the equivalences compare something
    assert np.linalg.norm(single(name)) > 1e-3


def test_dragan_mirrored_step_equals_single_device():
    """DRAGAN's perturbation (scaled by the whole batch's std) and weights come with the
    data (`gan.with_noise`), so two replicas take the single device's penalty. SGD: the
    update is proportional to the gradient, so a penalty computed from another
    perturbation (a replica's own std) moves the weights elsewhere."""
    def run(strategy, penalty=gan.dragan_penalty):
        return gan_step(strategy, penalty, lambda: keras.optimizers.SGD(0.01))

    one = run(tf.distribute.get_strategy())
    assert np.linalg.norm(one - run(tf.distribute.get_strategy(), None)) > 1e-3  # it matters
    np.testing.assert_allclose(run(distribute.make_strategy("mirrored")), one, atol=1e-6)


def test_replicas_drawing_their_own_noise_are_not_the_single_device_step():
    """Without `gan.with_noise` each replica samples its own z and GP weights: the same
    distribution, other numbers; the equivalence test would catch that."""
    def step(strategy):
        with strategy.scope():
            keras.utils.set_random_seed(0)
            generator, critic = mlp(2, 2), mlp(2, 1)
            opts = [keras.optimizers.SGD(0.1) for _ in range(2)]
        fn = gan.make_gan_step(generator, critic, *opts, latent_dim=2, n_critic=1,
                               strategy=strategy)
        data = iter(distribute.distribute_dataset(
            strategy, gan.toy_batches("eight_gaussians", 32, seed=0)))
        keras.utils.set_random_seed(1)
        fn((next(data),))
        return flat(critic.trainable_variables)

    assert np.abs(step(distribute.make_strategy("mirrored")) -
                  step(tf.distribute.get_strategy())).max() > 1e-4


@pytest.mark.slow
def test_two_process_multi_worker_steps_equal_single_device(tmp_path, single):
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
        batches = iter(distribute.distribute_dataset(strategy,
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


@pytest.mark.slow
def test_binaries_take_their_strategy_from_gin_and_agree_with_one_device(tmp_path):
    """The PINN and Hessian-spectrum binaries under configs/strategy/mirrored_2cpu.gin give
    the single-device metrics (deterministic steps); the GAN and MAML binaries run under it.
    Plain tf.functions on one device too: two replicas take them ("auto" leaves XLA to one
    replica), and XLA's compiles on one device were a fifth of this test's time."""
    from experiments import gan as gan_binary, hessian_spectrum, maml, pinn
    from hogrod import harness
    mirrored = ["configs/strategy/mirrored_2cpu.gin"]
    runs = [
        (pinn.pinn_experiment, ["configs/pinn/heat.gin"],
         ["pinn_experiment.width = 16", "pinn_experiment.depth = 2",
          "pinn_experiment.n_collocation = 512", "pinn_experiment.n_condition = 64",
          "pinn_experiment.adam_steps = 20", "pinn_experiment.lbfgs_maxiter = 20",
          "pinn_experiment.dtype = 'float64'", "pinn_experiment.jit_compile = False"],
         ["relative_l2", "relative_l2_after_adam"]),
        (hessian_spectrum.hessian_spectrum, ["configs/curvature/spectrum_mlp.gin"],
         ["hessian_spectrum.hidden = (8,)", "hessian_spectrum.steps = 20",
          "hessian_spectrum.n_examples = 256", "hessian_spectrum.slq_steps = 10",
          "hessian_spectrum.hutchpp_matvecs = 6",
          # each product under the strategy iterates a distributed dataset: few of them
          "hessian_spectrum.top_k = 2", "hessian_spectrum.slq_runs = 1",
          "hessian_spectrum.dense_check_max_params = 0", "make_train_step.jit_compile = False"],
         ["top_eigenvalues", "trace_hutchpp"]),
    ]
    for i, (fn, files, params, keys) in enumerate(runs):
        _, one = harness.run(fn, files, params, str(tmp_path / f"one{i}"))
        _, two = harness.run(fn, files + mirrored, params, str(tmp_path / f"two{i}"))
        for key in keys:
            np.testing.assert_allclose(two[key], one[key], rtol=1e-4, err_msg=key)
    _, m = harness.run(gan_binary.gan_experiment, ["configs/gan/eight_gaussians.gin"]
                       + mirrored, ["gan_experiment.generator_steps = 2",
                                    "gan_experiment.width = 16",
                                    "gan_experiment.eval_samples = 100"], str(tmp_path / "g"))
    assert m["step"] == 2
    _, m = harness.run(maml.maml_experiment, ["configs/maml/sinusoid_maml.gin"] + mirrored,
                       ["maml_experiment.meta_iterations = 3", "sinusoid_data.eval_tasks = 10",
                        "maml_experiment.eval_steps = (0, 1)"],
                       str(tmp_path / "m"))
    assert m["meta_iterations"] == 3


@pytest.mark.slow
def test_scaling_benchmark_measures_each_replica_count_in_its_own_process(tmp_path):
    from experiments.bench import scaling
    from hogrod import harness
    _, m = harness.run(scaling.bench_scaling, [bench_config("scaling")], [
        "bench_scaling.families = ('curvature',)", "bench_scaling.replicas = (1, 2)",
        "bench_scaling.multi_worker = False", "bench_scaling.steps = 1",
        "bench_scaling.rounds = 1", "bench_scaling.warmup = 1"], str(tmp_path))
    assert [r["replicas"] for r in m["runs"].values()] == [1, 2]
    assert m["runs"]["mirrored_1"]["curvature"]["speedup"] == 1.0
    assert (tmp_path / "scaling.md").exists()
