"""Loss weighting: fixed weights (a dict given to `pinn_loss`) or learning-rate annealing.

Learning-rate annealing (Wang, Teng and Perdikaris 2021): every few steps, each condition
term's weight moves toward max |grad of the residual term| / mean |grad of that term|, so
terms whose gradients are small next to the residual's get weighed up. The weights are
`tf.Variable`s that `pinn_loss` multiplies its terms by.
"""

import tensorflow as tf

import hogrod

__all__ = ["annealing_weights"]


def annealing_weights(term_fn, variables, names, alpha=0.9):
    """(weights, update): `weights` {name: tf.Variable(1.0)} for `pinn_loss`, and a compiled
    `update()` that moves each toward its balancing value by a moving average (`alpha` on
    the old value).

    term_fn: `term_fn() -> {name: scalar}` of the UNWEIGHTED terms, "residual" among them.
    """
    weights = {n: tf.Variable(1.0, trainable=False, name=f"weight_{n}") for n in names}

    @tf.function
    def update():
        # hogrod.grad, not tape.gradient(unconnected_gradients=ZERO): the latter fails on
        # Keras 3 variables (their dtype is a string).
        g_res = hogrod.grad(lambda: term_fn()["residual"], variables)
        top = tf.reduce_max([tf.reduce_max(tf.abs(g)) for g in g_res])
        for n in names:
            g = hogrod.grad(lambda n=n: term_fn()[n], variables)
            mean = tf.reduce_mean(tf.concat([tf.reshape(tf.abs(x), [-1]) for x in g], 0))
            target = top / tf.maximum(mean, 1e-12)
            weights[n].assign(alpha * weights[n] + (1 - alpha) * target)
        return {n: w.read_value() for n, w in weights.items()}
    return weights, update
