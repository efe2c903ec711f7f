"""The primitives on your own Keras model: grad, hvp, hessian, jacobian, functional_call.

    python docs/guide/primitives.py            # full size
    python docs/guide/primitives.py --quick    # small (HOGROD_GUIDE_QUICK=1 does the same)

Every result is checked against an oracle that does not use the function under test:
float64 central differences, the dense Hessian, a closed form, a numpy forward pass.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hogrod  # noqa: E402


def make_classifier(n_features=3, hidden=8, n_classes=2):
    """Your own model: any built Keras 3 model works; float64 makes the checks tight."""
    return keras.Sequential([
        keras.Input((n_features,), dtype="float64"),
        keras.layers.Dense(hidden, activation="tanh", dtype="float64", name="body"),
        keras.layers.Dense(n_classes, dtype="float64", name="head"),
    ])


def cross_entropy(y_true, logits):  # Keras convention: loss(y_true, y_pred)
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y_true, logits))


def flat(tensors):
    return np.concatenate([np.ravel(t) for t in tensors])


def main(quick=False):
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    n = 16 if quick else 256
    x = tf.constant(rng.normal(size=(n, 3)))
    y = tf.constant(rng.integers(0, 2, n), tf.int32)
    model = make_classifier()
    params = model.trainable_variables            # [body kernel, body bias, head kernel, head bias]

    loss = lambda: cross_entropy(y, model(x))      # noqa: E731  (a callable of no arguments)

    def loss_at(weights):                          # the same loss with substitute weights
        return cross_entropy(y, hogrod.functional_call(model, weights, x))

    # -- value_and_grad / grad: (scalar, list shaped like params) ---------------------------
    value, grads = hogrod.value_and_grad(loss, params)
    assert [g.shape for g in grads] == [p.shape for p in params]
    w0 = hogrod.trainable_values(model)            # tensors: a copy of the current weights
    d = [tf.constant(rng.normal(size=p.shape)) for p in params]
    eps = 1e-5
    fd = (loss_at([w + eps * di for w, di in zip(w0, d)])
          - loss_at([w - eps * di for w, di in zip(w0, d)])) / (2 * eps)
    assert abs(float(fd) - flat(grads) @ flat(d)) < 1e-8, "gradient vs central differences"

    # -- hvp: H v, shaped like params, both modes ---------------------------------------------
    v = [tf.constant(rng.normal(size=p.shape)) for p in params]
    grad_at = lambda w: hogrod.grad(lambda: loss_at(w), w)  # noqa: E731
    fd_hv = (flat(grad_at([w + eps * vi for w, vi in zip(w0, v)]))
             - flat(grad_at([w - eps * vi for w, vi in zip(w0, v)]))) / (2 * eps)
    for mode in ("forward_over_reverse", "reverse_over_reverse"):
        hv = hogrod.hvp(loss, params, v, mode=mode)
        err = np.linalg.norm(flat(hv) - fd_hv) / np.linalg.norm(fd_hv)
        assert err < 1e-7, f"hvp ({mode}) vs central differences of the gradient: {err}"

    # -- hessian: dense [P, P], params flattened row-major in list order -----------------------
    H = hogrod.hessian(loss, params).numpy()
    num_params = sum(int(np.prod(p.shape)) for p in params)
    assert H.shape == (num_params, num_params)
    assert np.allclose(H, H.T, atol=1e-12)
    assert np.allclose(H @ flat(v), flat(hogrod.hvp(loss, params, v)), rtol=1e-9, atol=1e-12)

    # -- jacobian / batch_jacobian of the outputs with respect to the inputs -------------------
    J = hogrod.jacobian(model, x).numpy()              # [n, 2, n, 3]: every output, every input
    Jb = hogrod.batch_jacobian(model, x).numpy()       # [n, 2, 3]: output i w.r.t. input i only
    assert J.shape == (n, 2, n, 3) and Jb.shape == (n, 2, 3)
    assert np.allclose(Jb, J[np.arange(n), :, np.arange(n), :], atol=1e-12)
    W1, b1, W2, b2 = [w.numpy() for w in w0]       # closed form of d logits / d x
    h = np.tanh(x.numpy() @ W1 + b1)
    Jb_closed = np.einsum("nh,hi,kh->nik", 1 - h ** 2, W2, W1)
    assert np.allclose(Jb, Jb_closed, atol=1e-12)

    # -- derivatives: [f', f'', ..., f^(order)] of an elementwise function --------------------
    t = tf.constant(np.linspace(-2.0, 2.0, 9))
    d1, d2, d3 = hogrod.derivatives(lambda s: s * s * s, t, 3)
    assert np.allclose(d1, 3 * t ** 2) and np.allclose(d2, 6 * t) and np.allclose(d3, 6.0)

    # -- gnvp: Gauss-Newton product J_theta^T H_L J_theta v, shaped like params ----------------
    gv = hogrod.gnvp(lambda: model(x), lambda z: cross_entropy(y, z), params, v)
    with tf.GradientTape() as tape:
        z = model(x)
    Jp = tape.jacobian(z, params)                  # d logits / d params, per param
    Jp = np.concatenate([np.reshape(j, (2 * n, -1)) for j in Jp], axis=1)
    z_const = tf.constant(z.numpy())
    H_L = hogrod.hessian(lambda: cross_entropy(y, z_const), z_const).numpy()
    assert np.allclose(flat(gv), Jp.T @ (H_L @ (Jp @ flat(v))), rtol=1e-9, atol=1e-12)

    # -- functional_call: model(x) with other weights; outer tapes see through them ------------
    doubled = [2.0 * w for w in w0]
    out = hogrod.functional_call(model, doubled, x).numpy()
    numpy_forward = np.tanh(x.numpy() @ (2 * W1) + 2 * b1) @ (2 * W2) + 2 * b2
    assert np.allclose(out, numpy_forward, atol=1e-12)
    assert np.allclose(model.get_layer("body").kernel.numpy(), W1)  # the model is not written

    # -- state: BatchNorm statistics and Dropout seeds, threaded explicitly --------------------
    stateful = keras.Sequential([keras.Input((3,)), keras.layers.Dense(8),
                                 keras.layers.BatchNormalization(), keras.layers.Dropout(0.5),
                                 keras.layers.Dense(1)])
    state = hogrod.model_state(stateful)           # list, model.non_trainable_variables order
    names = [v.path for v in stateful.non_trainable_variables]
    w = hogrod.trainable_values(stateful)
    xf = tf.cast(x, tf.float32)
    out1, state1 = hogrod.functional_call(stateful, w, xf, training=True, state=state)
    again, _ = hogrod.functional_call(stateful, w, xf, training=True, state=state)
    out2, _ = hogrod.functional_call(stateful, w, xf, training=True, state=state1)
    assert np.array_equal(out1, again), "same state in, same output (pure)"
    assert not np.array_equal(out1, out2), "the returned state has a new dropout seed"
    assert not np.allclose(state1[0], state[0]), "and updated BatchNorm moving statistics"
    assert np.allclose(stateful.non_trainable_variables[0].numpy(), 0.0)  # model untouched

    print(f"primitives: loss {float(value):.4f}, {num_params} params, state {names}")
    return {"loss": float(value), "num_params": num_params, "state_names": names}


if __name__ == "__main__":
    main(quick="--quick" in sys.argv[1:] or os.environ.get("HOGROD_GUIDE_QUICK") == "1")
