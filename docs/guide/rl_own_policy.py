"""Policy gradients of every order on your own MDP and your own Keras policy: DiCE and
Loaded DiCE against a small MDP's exact derivatives, and a Gaussian policy of your own.

    python docs/guide/rl_own_policy.py            # 65,536 episodes per estimate
    python docs/guide/rl_own_policy.py --quick    # 4,096 (HOGROD_GUIDE_QUICK=1 too)

Three parts, each checked against an oracle that does not use the function under test:

(a) `hogrod.rl.dice_surrogate` on episodes of a small `TabularMDP` sampled from a tabular
    softmax policy (a Keras layer wrapped in `CategoricalPolicy`): its value against the
    sample return in numpy; its gradient and Hessian, by nested tapes, against the exact
    ones of `expected_return` (dynamic programming), within 5 standard errors of 8
    independent sub-batches (fixed seeds). The naive surrogate log_prob * return, whose
    Hessian is biased, fails the same check.
(b) Loaded DiCE (`values=`) with the linear feature baseline fitted on other episodes: the
    same check, and a smaller standard error of the gradient than DiCE's.
(c) A Gaussian policy on your own Keras network (`GaussianPolicy`) rolled out on 2D
    navigation: `distribution(obs, params)` against numpy's Gaussian log-density, DiCE's
    gradient through it against its closed form (the score function times the return to
    go, in numpy), and MAML-RL's inner step (`inner_step`) against that gradient.

Every objective here is MAXIMIZED (an expected return); batches of episodes are `[batch, T]`
tensors with a `mask` (1 until an episode ends, 0 after).
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hogrod  # noqa: E402
from hogrod import rl  # noqa: E402

S, A, T, GAMMA = 2, 2, 3, 0.9           # states, actions, horizon, discount
GROUPS = 8                               # independent sub-batches for the standard errors


def own_mdp(seed=0):
    """Your own finite MDP: transitions [S, A, S], rewards [S, A], initial [S]."""
    rng = np.random.default_rng(seed)
    return (rng.dirichlet(np.ones(S), size=(S, A)), rng.normal(size=(S, A)),
            np.array([0.3, 0.7]), rng.normal(size=(S, A)))   # ..., the policy's logits


def tabular_policy(logits):
    """A tabular softmax policy as a Keras model: one-hot states times a [S, A] kernel are
    the logits of pi(a | s) = softmax(logits[s])."""
    layer = keras.layers.Dense(A, use_bias=False, dtype="float64")
    policy = rl.CategoricalPolicy(layer, A, dtype="float64")
    policy.build((None, S))
    layer.kernel.assign(logits)
    return policy


def exact_derivatives(theta, mdp):
    """J(theta), its gradient [S, A] and Hessian [S*A, S*A], by nested tapes on the exact
    expected return (dynamic programming over the state distribution)."""
    transitions, rewards, initial = mdp
    theta = tf.constant(theta)
    with tf.GradientTape() as outer:
        outer.watch(theta)
        with tf.GradientTape() as inner:
            inner.watch(theta)
            j = rl.expected_return(theta, transitions, rewards, initial, GAMMA, T)
        g = inner.gradient(j, theta)
    h = outer.jacobian(g, theta)
    return float(j), g.numpy(), h.numpy().reshape(S * A, S * A)


def group_estimates(policy, episodes, objective):
    """The gradient [GROUPS, S*A] and Hessian [GROUPS, S*A, S*A] that `objective(log_probs,
    rewards, mask, group)` gives on each of GROUPS equal sub-batches, by nested tapes.

    Each sub-batch's log-probabilities are computed from its own copy of the policy's
    parameters (`distribution(observations, params)`), so one gradient of the sum over
    sub-batches is every sub-batch's gradient, and S*A more give their Hessians' rows."""
    copies = [tf.convert_to_tensor(policy.trainable_variables[0]) for _ in range(GROUPS)]
    parts = [tf.split(t, GROUPS) for t in episodes[:4]]  # observations, actions, ..., rewards
    masks = tf.split(episodes.mask, GROUPS)
    with tf.GradientTape(persistent=True) as outer:
        outer.watch(copies)
        with tf.GradientTape() as inner:
            inner.watch(copies)
            total = 0.0
            for g, (obs, actions, _, rewards) in enumerate(zip(*parts)):
                # log pi(a_t | s_t) recomputed under the tapes: [batch / GROUPS, T]
                log_probs = rl.policy_distribution(policy, obs, [copies[g]]).log_prob(actions)
                total += objective(log_probs, rewards, masks[g], g)
        grads = tf.reshape(tf.stack(inner.gradient(total, copies)), [GROUPS, S * A])
        rows = [tf.reduce_sum(grads[:, i]) for i in range(S * A)]
    hessians = [tf.reshape(tf.stack(outer.gradient(row, copies)), [GROUPS, S * A])
                for row in rows]                   # row i of every sub-batch's Hessian
    return grads.numpy(), np.stack([h.numpy() for h in hessians], axis=1)


def worst_z(estimates, exact):
    """The largest |mean - exact| over entries, in standard errors of the mean."""
    se = estimates.std(0, ddof=1) / np.sqrt(len(estimates))
    return float(np.max(np.abs(estimates.mean(0) - exact) / (se + 1e-12))), se


def flatten(episodes):
    """One task's `Trajectories` from a rollout's `[tasks=1, batch, T, ...]` fields."""
    return rl.Trajectories(*(t[0] for t in episodes))


# ---- (a) DiCE against the exact derivatives; (b) Loaded DiCE with a baseline -----------------

def dice_on_own_mdp(batch):
    transitions, rewards, initial, theta = own_mdp()
    mdp = (transitions, rewards, initial)
    env = rl.TabularMDP(transitions, rewards, initial, horizon=T, dtype="float64")
    policy = tabular_policy(theta)
    task = env.sample_tasks(0, 1)                     # one task: the MDP's tables
    episodes = flatten(rl.rollout(env, policy, task, seed=1, batch=batch))   # [batch, T]
    j, g, h = exact_derivatives(theta, mdp)

    # the value is the mean discounted return of the sample (the magic boxes are 1)
    value = rl.dice_surrogate(rl.policy_distribution(policy, episodes.observations).log_prob(
        episodes.actions), episodes.rewards, GAMMA, mask=episodes.mask)
    r = (episodes.rewards * episodes.mask).numpy()
    assert abs(float(value) - np.mean(r @ GAMMA ** np.arange(T))) < 1e-12

    def dice(log_probs, rewards, mask, _):
        return rl.dice_surrogate(log_probs, rewards, GAMMA, mask=mask)

    def naive(log_probs, rewards, mask, _):  # log_prob * return: right gradient only
        ret = tf.reduce_sum(rewards * mask * GAMMA ** np.arange(T), 1)
        return tf.reduce_mean(tf.reduce_sum(log_probs * mask, 1) * ret)

    # (b) the baseline: the linear feature baseline fitted on episodes of their own
    # (a baseline fitted on the estimation batch itself would correlate with it)
    other = flatten(rl.rollout(env, policy, task, seed=2, batch=batch))
    baseline = rl.LinearFeatureBaseline(env.observation_dim, dtype="float64")
    baseline.fit(other.observations, rl.discounted_returns(other.rewards, GAMMA, other.mask),
                 other.mask)
    v = tf.split(baseline.predict(episodes.observations, episodes.mask), GROUPS)

    def loaded(log_probs, rewards, mask, group):
        return rl.dice_surrogate(log_probs, rewards, GAMMA, values=v[group], mask=mask)

    z, se = {}, {}
    for name, objective in (("dice", dice), ("loaded", loaded), ("naive", naive)):
        grads, hessians = group_estimates(policy, episodes, objective)
        z[name, "grad"], se[name, "grad"] = worst_z(grads, g.ravel())
        z[name, "hess"], se[name, "hess"] = worst_z(hessians, h)
    for name in ("dice", "loaded"):   # unbiased to every order: within 5 standard errors
        assert z[name, "grad"] < 5 and z[name, "hess"] < 5, (name, z)
    assert z["naive", "grad"] < 5 and z["naive", "hess"] > 10, z   # the check has power
    # the baseline lowers the variance (the expectations are the same)
    assert np.mean(se["loaded", "grad"]) < np.mean(se["dice", "grad"]), se
    return {"J": j, "z": z, "se_grad": {k: float(np.mean(se[k, "grad"]))
                                        for k in ("dice", "loaded")}}


# ---- (c) your own Keras policy ---------------------------------------------------------------

def own_gaussian_policy():
    """A Gaussian policy on your own network: any built Keras model from observations to
    the action means; the policy adds a learned state-independent log standard deviation."""
    network = keras.Sequential([keras.Input((2,), dtype="float64"),
                                keras.layers.Dense(2, dtype="float64", name="mean")])
    policy = rl.GaussianPolicy(network, 2, init_std=0.5, dtype="float64")
    policy.build((None, 2))
    return policy


def numpy_dice_gradient(params, names, episodes, discount):
    """DiCE's first derivative in closed form for a linear-mean Gaussian policy:
    mean_b sum_t G_t grad log pi(a_t | o_t), G_t = sum_{k>=t} discount**k r_k (masked)."""
    p = dict(zip(names, params))
    o, a = episodes.observations.numpy(), episodes.actions.numpy()
    m = episodes.mask.numpy()
    std = np.exp(p["log_std"])
    z = (a - (o @ p["kernel"] + p["bias"])) / std                     # [batch, T, 2]
    weighted = episodes.rewards.numpy() * m * discount ** np.arange(m.shape[1])
    to_go = (np.cumsum(weighted[:, ::-1], 1)[:, ::-1] * m)[..., None]  # [batch, T, 1]
    n = m.shape[0]
    return {"kernel": np.einsum("bti,btd->id", o, to_go * z / std) / n,
            "bias": np.sum(to_go * z / std, (0, 1)) / n,
            "log_std": np.sum(to_go * (z * z - 1), (0, 1)) / n}


def own_policy_on_navigation(horizon, batch):
    keras.utils.set_random_seed(0)
    env = rl.Navigation2D(horizon=horizon, dtype="float64")
    policy = own_gaussian_policy()
    names = [v.path.split("/")[-1] for v in policy.trainable_variables]  # log_std, kernel, bias
    params = hogrod.trainable_values(policy)          # tensors in trainable_variables order
    tasks = env.sample_tasks(3, 2)                    # two goals
    episodes = flatten(rl.rollout(env, policy, tasks, seed=4, batch=batch))  # the first goal's
    obs, actions = episodes.observations, episodes.actions

    # distribution(obs, params): the policy evaluated at other parameters (a pure call)
    dist = rl.policy_distribution(policy, obs, params)    # DiagonalGaussian [batch, T, 2]
    p = dict(zip(names, (t.numpy() for t in params)))
    mean, std = obs.numpy() @ p["kernel"] + p["bias"], np.exp(p["log_std"])
    log_density = np.sum(-0.5 * ((actions.numpy() - mean) / std) ** 2 - np.log(std)
                         - 0.5 * np.log(2 * np.pi), -1)
    assert np.allclose(dist.log_prob(actions), log_density, rtol=1e-12, atol=1e-12)

    # DiCE's gradient through distribution(obs, params) against its closed form
    with tf.GradientTape() as tape:
        tape.watch(params)
        log_probs = rl.policy_distribution(policy, obs, params).log_prob(actions)  # [b, T]
        objective = rl.dice_surrogate(log_probs, episodes.rewards, 0.99, mask=episodes.mask)
    grads = dict(zip(names, tape.gradient(objective, params)))
    want = numpy_dice_gradient([t.numpy() for t in params], names, episodes, 0.99)
    for name in names:
        assert np.allclose(grads[name], want[name], rtol=1e-10, atol=1e-12), name

    # MAML-RL's inner step: params + inner_lr * that gradient (no baseline here)
    adapted = rl.inner_step(policy, params, episodes, inner_lr=0.1, discount=0.99)
    for name, new, old in zip(names, adapted, params):
        assert np.allclose(new, old + 0.1 * want[name], rtol=1e-10, atol=1e-12), name
    return {"return": float(np.mean(np.sum((episodes.rewards * episodes.mask).numpy(), 1)))}


def main(quick=False):
    dice = dice_on_own_mdp(batch=4096 if quick else 65536)
    nav = own_policy_on_navigation(horizon=5 if quick else 100, batch=8 if quick else 40)
    z = dice["z"]
    print(f"rl_own_policy: J = {dice['J']:.5f}; worst |estimate - exact| in standard errors, "
          f"gradient / Hessian: DiCE {z['dice', 'grad']:.2f} / {z['dice', 'hess']:.2f}, Loaded "
          f"DiCE {z['loaded', 'grad']:.2f} / {z['loaded', 'hess']:.2f}, naive surrogate "
          f"{z['naive', 'grad']:.2f} / {z['naive', 'hess']:.3g}; gradient standard error DiCE "
          f"{dice['se_grad']['dice']:.2e}, Loaded DiCE {dice['se_grad']['loaded']:.2e}; "
          f"2D navigation return of the untrained policy {nav['return']:.3f}")
    return {"dice": dice, "navigation": nav}


if __name__ == "__main__":
    main(quick="--quick" in sys.argv[1:] or os.environ.get("HOGROD_GUIDE_QUICK") == "1")
