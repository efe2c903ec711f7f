"""Top-k eigenpairs of a symmetric curvature operator: `top_eigenvalues`, by Lanczos
(default) or power iteration with deflation.

Both methods work on any operator with `matvec_flat(vector)` (the operators of this package) or a
dense symmetric matrix and return `(eigenvalues, eigenvectors, num_matvecs)` as float64
numpy, eigenvalues sorted from the requested end. The iterations are `hogrod.linalg`'s,
run as one compiled loop in float64 whose products call the operator on the host
(`host_solver`); the small tridiagonal eigenproblems are scipy's.
"""

import functools
import os
import threading
from typing import Any, Callable, Optional, Tuple, Union

import numpy as np
import scipy.linalg
import tensorflow as tf
from absl import logging

from hogrod import checks, linalg
from hogrod.types import TensorLike

__all__ = ["top_eigenvalues", "METHODS", "as_matvec", "host_solver"]

METHODS = ("lanczos", "power")


def as_matvec(op: Union[tf.linalg.LinearOperator, TensorLike]
              ) -> Tuple[Callable[[np.ndarray], np.ndarray], int]:
    """The host product of an operator or a dense matrix.

    A product that is not finite (a NaN/inf loss, or weights that overflowed) is an error
    naming the operator, so no estimator returns a silent NaN.

    Args:
      op: anything with `matvec_flat` (the operators of this package) or a square matrix.

    Returns:
      `(matvec, n)`: matvec on float64 numpy vectors of length n.

    Raises:
      ValueError: `op` is a matrix that is not square.
    """
    if hasattr(op, "matvec_flat"):
        dtype, name = op.dtype, op.name
        raw = lambda v: op.matvec_flat(tf.constant(v, dtype)).numpy().astype(np.float64)  # noqa
        n = int(op.shape[0])
    else:
        a = np.asarray(op, np.float64)
        if a.ndim != 2 or a.shape[0] != a.shape[1]:
            raise ValueError(f"expected a curvature operator or a square matrix, got shape "
                             f"{a.shape}")
        raw, n, name = (lambda v: a @ v), a.shape[0], "matrix"

    def matvec(v):
        w = raw(v)
        if not np.all(np.isfinite(w)):
            raise FloatingPointError(f"{name}: the product with a finite vector is not finite "
                                     f"({int(np.sum(~np.isfinite(w)))} of {n} entries); check the "
                                     "loss and the parameters for NaN/inf")
        return w
    return matvec, n


_running = []  # the host callables of the compiled solve running now (innermost last)
_running_lock = threading.RLock()


def _dispatch(name):
    return lambda *args: _running[-1][name](*args)


@functools.lru_cache(maxsize=64)
def _compiled(solver, n, static, with_stop, indexed):
    """One tf.function per solver and configuration, shared by every host_solver call with
    it: its numpy_functions call whatever host callables the running call registered, so
    a second estimate with the same configuration does not trace again. Module-level but
    safe: the key holds the solver function and hashable values (never an id), the
    function captures nothing of a call (operator, matvec, stop go through `_running`,
    popped when the call ends), and at most 64 configurations are kept."""
    def product(v):
        w = tf.numpy_function(_dispatch("matvec"), [v], tf.float64, stateful=True)
        w.set_shape([n])
        return w

    def product_at(v, k):  # the term index k reaches the host matvec
        w = tf.numpy_function(_dispatch("matvec"), [v, k], tf.float64, stateful=True)
        w.set_shape([n])
        return w

    kwargs = dict(static)
    if with_stop:
        kwargs["stop"] = lambda *state: tf.numpy_function(_dispatch("stop"), list(state),
                                                          tf.bool, stateful=True)
    return tf.function(lambda *args: solver(product_at if indexed else product, *args,
                                            **kwargs), autograph=False)


def _check_inter_op_threads():
    """The compiled loop holds an inter-op thread while its numpy_function runs the host
    product, and a product that runs TensorFlow (every operator's does) needs another:
    with one, the solve waits for itself forever."""
    threads = (tf.config.threading.get_inter_op_parallelism_threads()
               or os.environ.get("TF_NUM_INTEROP_THREADS", "").strip())
    if str(threads) == "1":
        raise RuntimeError(
            "hogrod.curvature solvers need at least 2 TensorFlow inter-op threads: their "
            "compiled loop waits on a host product that runs TensorFlow itself, and with "
            "one thread it would wait forever. Unset TF_NUM_INTEROP_THREADS=1 or call "
            "tf.config.threading.set_inter_op_parallelism_threads with 2 or more (0 is "
            "TensorFlow's default, one per core).")


def host_solver(solver: Callable[..., Any], matvec: Callable[..., np.ndarray], n: int,
                stop: Optional[Callable[..., Any]] = None, indexed: bool = False,
                **static: Any) -> Callable[..., Any]:
    """A `hogrod.linalg` solver compiled once, its products calling a host `matvec`.

    Returns `run(*args)`: `solver(product, *args, stop=..., **static)` as one compiled
    loop, where `product` hands each float64 vector of length n to `matvec` (numpy in,
    numpy out) and `stop` (Lanczos's; optional) gets numpy arrays and returns a bool; its
    outputs come back as numpy. The compiled function is cached per (solver, n, static),
    so `static` must be hashable. An exception `matvec` raises (FloatingPointError on a
    NaN product) is re-raised as itself, not as TensorFlow's wrapper of it. Runs are
    serialized by a lock; a `matvec` must not itself run a host solver. `run` needs two
    or more TensorFlow inter-op threads (the loop waits on a product that runs
    TensorFlow): with one it raises a RuntimeError naming the setting, never hangs.

    Args:
      solver: a `hogrod.linalg` solver `solver(matvec, *args, **static)`.
      matvec: the host product, numpy float64 [n] -> [n]; with `indexed`, `matvec(v, k)`
        with k the solver's index of the product (an int), as `linalg.neumann` passes it.
      n: the vectors' length.
      stop: Lanczos's optional host stopping test.
      indexed: whether `matvec` takes the product's index.
      **static: the solver's other (hashable) arguments.

    Returns:
      `run(*args)`, returning the solver's outputs as numpy.
    """
    errors = []

    def host(v, *k):
        try:
            return np.asarray(matvec(v, *(int(i) for i in k)), np.float64)
        except Exception as e:  # noqa: BLE001 (re-raised below, unwrapped)
            errors.append(e)
            raise

    compiled = _compiled(solver, n, tuple(sorted(static.items())), stop is not None,
                         bool(indexed))

    def run(*args):
        _check_inter_op_threads()
        with _running_lock:
            errors.clear()
            _running.append({"matvec": host, "stop": stop})
            try:
                out = compiled(*args)
            except tf.errors.OpError:
                if errors:
                    raise errors[-1] from None
                raise
            finally:
                _running.pop()
        return tf.nest.map_structure(lambda t: t.numpy(), out)
    return run


def top_eigenvalues(op: Union[tf.linalg.LinearOperator, TensorLike], k: int = 1,
                    method: str = "lanczos", which: str = "largest", tol: float = 1e-6,
                    maxiter: Optional[int] = None,
                    seed: int = 0) -> Tuple[np.ndarray, np.ndarray, int]:
    """The k eigenpairs of a symmetric operator at one end of its spectrum.

    Args:
      op: a curvature operator (anything with `matvec_flat`) or a dense symmetric matrix.
      k: how many eigenpairs (an int, 1 <= k <= n).
      method: "lanczos" (full reorthogonalization, `hogrod.linalg.lanczos`) or "power"
        (power iteration with deflation, `hogrod.linalg.power_iteration`: "largest" finds
        the largest-magnitude eigenvalues, the largest for a PSD operator; "smallest"
        shifts by the largest eigenvalue to find the most negative).
      which: "largest" (algebraically largest) or "smallest" (most negative).
      tol: Lanczos stops when every wanted Ritz pair has residual ``abs(beta_m s_mi) <= tol
        * abs(theta_i)``; power iteration when an iterate's eigenvalue estimate changes by
        <= tol (>= 0).
      maxiter: Lanczos's Krylov dimension cap (default min(n, 10k + 100); reaching it
        before `tol` logs a warning; tol=0 runs exactly that many) or power iteration's
        iterations per eigenpair (default 1000).
      seed: the start vectors' numpy seed (an int >= 0).

    Returns:
      `(eigenvalues [k], eigenvectors [n, k], num_matvecs)`, float64 numpy and an int,
      eigenvalues sorted from the requested end.

    Raises:
      ArgumentError: an argument out of its range.
      ValueError: the Krylov space of the start vector is invariant before k steps (the
        operator has fewer than k distinct eigenvalues there).
      FloatingPointError: a product is not finite.
    """
    where = "top_eigenvalues"
    checks.choice(method, METHODS, "method", where)
    checks.choice(which, ("largest", "smallest"), "which", where)
    checks.number(tol, "tol", where, low=0.0)
    checks.seed(seed, "seed", where)
    if maxiter is not None:
        maxiter = checks.integer(maxiter, "maxiter", where, least=1)
    matvec, n = as_matvec(op)
    k = checks.integer(k, "k", where, least=1, most=n)
    if method == "lanczos":
        return _lanczos(matvec, n, k, which, tol, maxiter, seed)
    return _power(matvec, n, k, which, tol, 1000 if maxiter is None else maxiter, seed)


def _lanczos(matvec, n, k, which, tol, maxiter, seed):
    m_max = min(n, maxiter or 10 * k + 100)

    def ritz(alphas, betas):  # Ritz values, T's eigenvectors, the wanted ones' indices
        theta, s = scipy.linalg.eigh_tridiagonal(alphas, betas)
        order = np.argsort(theta)[::-1] if which == "largest" else np.argsort(theta)
        return theta, s, order[:k]

    def residuals(alphas, betas, beta):  # |beta_m s_mi| / |theta_i| of the wanted pairs
        theta, s, wanted = ritz(alphas, betas)
        return np.abs(beta * s[-1, wanted]) / np.maximum(np.abs(theta[wanted]), 1e-12)

    def converged(alphas, betas, beta):
        return np.bool_(len(alphas) >= k and np.all(residuals(alphas, betas, beta) <= tol))

    run = host_solver(linalg.lanczos, matvec, n, stop=converged, k=m_max)
    alphas, betas, basis, beta = run(tf.constant(
        np.random.default_rng(seed).standard_normal(n)))
    m = len(alphas)
    if m < k:
        raise ValueError(f"top_eigenvalues: the Krylov space of the start vector (seed={seed}) "
                         f"is invariant after {m} < k={k} steps: the operator has fewer than k "
                         "distinct eigenvalues there; ask for fewer (k) or another seed")
    if tol > 0 and m == m_max < n and not converged(alphas, betas, beta):
        logging.warning("top_eigenvalues: %d Lanczos iterations without reaching tol=%g "
                        "(largest relative residual %.2e)", m, tol,
                        np.max(residuals(alphas, betas, beta)))
    theta, s, wanted = ritz(alphas, betas)
    return theta[wanted], basis.T @ s[:, wanted], m


def _power(matvec, n, k, which, tol, maxiter, seed):
    rng = np.random.default_rng(seed)
    count, shift = 0, 0.0
    if which == "smallest":
        top, _, count = _power(matvec, n, 1, "largest", tol, maxiter, seed)
        shift = abs(top[0])
    values, vectors, products = [], [], []

    def deflated(v):  # P (A - shift I) P, P the projector off the eigenvectors found
        products.append(1)
        for u in vectors:
            v = v - (u @ v) * u
        w = matvec(v) - shift * v
        for u in vectors:
            w = w - (u @ w) * u
        return w

    run = host_solver(linalg.power_iteration, deflated, n, maxiter=maxiter, tol=tol)
    for _ in range(k):
        start = rng.standard_normal(n)
        lam, v = run(tf.constant(start))
        values.append(lam + shift)
        vectors.append(v)
    return np.array(values), np.stack(vectors, axis=1), count + len(products)
