"""Disks, CSG and Hammersley sampling against distances and definitions computed here."""

import math

import numpy as np
import pytest

from hogrod import pinn
from hogrod.pinn import geometry as G

C1, R1, C2, R2 = np.array([0.3, 0.2]), 0.4, np.array([-0.5, -0.5]), 0.3


def plate():
    """PINNacle-style: the square [-1, 1]^2 minus two disks."""
    return G.Box((-1, -1), (1, 1)) - G.Disk(C1, R1) - G.Disk(C2, R2)


def dist(x, c):
    return np.linalg.norm(x - c, axis=1)


def on_square(x, tol=1e-12):
    return (np.abs(np.abs(x) - 1) <= tol).any(1) & (np.abs(x) <= 1 + tol).all(1)


@pytest.mark.parametrize("method", G.METHODS)
def test_interior_samples_are_inside_and_exactly_n(method):
    x = pinn.sample(plate(), 777, method, seed=2, dtype=np.float64)
    assert x.shape == (777, 2) and x.dtype == np.float64
    assert np.all(np.abs(x) <= 1) and np.all(dist(x, C1) >= R1) and np.all(dist(x, C2) >= R2)
    assert len(np.unique(x, axis=0)) == 777
    # the area fraction on each half: uniform over the plate, not just inside it
    area = 4 - math.pi * (R1 ** 2 + R2 ** 2)
    left = 2 - math.pi * R2 ** 2 - (R1 ** 2 * math.acos(0.3 / R1) - 0.3 * math.sqrt(R1 ** 2 - 0.09))
    assert abs(np.mean(x[:, 0] < 0) - left / area) < 4 * math.sqrt(0.25 / 777)


def test_boundary_points_lie_on_every_piece_in_proportion_to_its_length():
    g = plate()
    b = g.boundary(3000, seed=1)
    assert b.shape == (3000, 2)
    on1, on2 = np.abs(dist(b, C1) - R1) < 1e-12, np.abs(dist(b, C2) - R2) < 1e-12
    sq = on_square(b)
    assert np.all(on1 | on2 | sq) and np.all(g.on_boundary(b)) and np.all(g.inside(b))
    lengths = np.array([8.0, 2 * math.pi * R1, 2 * math.pi * R2])
    for frac, share in zip((sq.mean(), on1.mean(), on2.mean()), lengths / lengths.sum()):
        assert abs(frac - share) < 4 * math.sqrt(share * (1 - share) / 3000)


def test_union_and_difference_boundaries_and_predicates():
    a, b = G.Box((0, 0), (2, 1)), G.Box((1, 0.5), (3, 2))
    u = a | b
    pts = u.boundary(2000, seed=3)

    def on_edges(x, lo, hi):
        lo, hi = np.array(lo), np.array(hi)
        inside = np.all((x >= lo - 1e-12) & (x <= hi + 1e-12), 1)
        return inside & np.any((np.abs(x - lo) < 1e-12) | (np.abs(x - hi) < 1e-12), 1)

    def strictly_in(x, lo, hi):
        return np.all((x > np.array(lo) + 1e-12) & (x < np.array(hi) - 1e-12), 1)

    ok = ((on_edges(pts, (0, 0), (2, 1)) & ~strictly_in(pts, (1, 0.5), (3, 2)))
          | (on_edges(pts, (1, 0.5), (3, 2)) & ~strictly_in(pts, (0, 0), (2, 1))))
    assert np.all(ok)
    perimeter = 6 + 7 - 2 * (1 + 0.5)  # each box's outline less the parts inside the other
    top_right = np.abs(pts[:, 1] - 2) < 1e-12  # the edge y = 2 of b, length 2
    assert abs(top_right.mean() - 2 / perimeter) < 4 * math.sqrt(0.2 * 0.8 / 2000)
    # in both, in neither, in b only, on a's edge outside b, on a's edge inside b, on b's
    # edge inside a
    probe = np.array([[1.5, 0.75], [2.5, 0.25], [2.0, 1.5], [0.5, 1.0], [1.5, 1.0], [1.5, 0.5]])
    T, F = True, False
    np.testing.assert_array_equal(u.inside(probe), [T, F, T, T, T, T])
    np.testing.assert_array_equal(u.on_boundary(probe), [F, F, F, T, F, F])
    d = a - b
    np.testing.assert_array_equal(d.inside(probe), [F, F, F, T, F, T])
    np.testing.assert_array_equal(d.on_boundary(probe), [F, F, F, T, F, T])
    np.testing.assert_array_equal((a & b).on_boundary(probe), [F, F, F, F, T, T])
    db = d.boundary(500, seed=4)  # a's outline outside b's interior, b's inside a
    assert np.all((on_edges(db, (0, 0), (2, 1)) & ~strictly_in(db, (1, 0.5), (3, 2)))
                  | (on_edges(db, (1, 0.5), (3, 2)) & np.all((db >= 0) & (db <= [2, 1]), 1)))


def test_a_ball_in_three_dimensions():
    ball = G.Disk((1.0, 0.0, -1.0), 2.0)
    assert math.isclose(ball.boundary_measure(), 4 * math.pi * 4.0)
    b = ball.boundary(500, seed=0)
    np.testing.assert_allclose(dist(b, ball.center), 2.0, rtol=1e-14)
    x = pinn.sample(ball, 300, "sobol", 0, np.float64)
    assert x.shape == (300, 3) and np.all(dist(x, ball.center) <= 2.0)


def test_hammersley_against_its_definition():
    h = G.hammersley(8, 3)
    np.testing.assert_array_equal(h[:, 0], np.arange(8) / 8)
    np.testing.assert_array_equal(h[:, 1], [0, .5, .25, .75, .125, .625, .375, .875])
    np.testing.assert_allclose(h[:, 2], np.array([0, 3, 6, 1, 4, 7, 2, 5]) / 9, rtol=1e-15)
    for i in (0, 1, 7, 123, 4097):  # the digits of i in base 5, reversed after the point
        digits = np.base_repr(i, 5)[::-1]
        want = sum(int(c) * 5.0 ** -(k + 1) for k, c in enumerate(digits)) if i else 0.0
        assert math.isclose(G.radical_inverse(i, 5), want, rel_tol=1e-15)
    box = pinn.Box((-1.0, 2.0, 0.0), (1.0, 3.0, 4.0))
    x = pinn.sample(box, 8, "hammersley", dtype=np.float64)
    np.testing.assert_allclose(x, box.low + G.hammersley(8, 3) * (box.high - box.low))


@pytest.mark.parametrize("make,match", [
    (lambda: pinn.sample(G.Disk((0, 0), 1) | G.Disk((1000, 1000), 1), 10), "fills too little"),
    (lambda: (G.Disk((0, 0), 1) - G.Box((-2, -2), (2, 2))).boundary(10), "cannot give points"),
    (lambda: pinn.sample("disk", 10), "geometry must be a Box"),
    (lambda: G.Box((0, 0), (1, 1)) - G.Disk((0, 0, 0), 1), "dimensions 2 and 3"),
    (lambda: G.Disk((0, 0), -1.0), "radius must be a positive"),
    (lambda: pinn.sample(G.Box((0,), (1,)), 0), "positive integer"),
    (lambda: pinn.sample(G.Box((0,), (1,)), 4, "halton"), "sampling method"),
    (lambda: G.Box((0, 0), (1, 1)).inside(np.zeros((3, 3))), r"shape \[n, 2\]"),
    (lambda: (G.Box((0, 0), (1, 1)) & G.Box((2, 2), (3, 3))).bbox, "is empty"),
])
def test_geometries_the_samplers_cannot_handle_are_clear_errors(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


@pytest.mark.parametrize("method", G.METHODS)
def test_rejection_draws_again_until_it_has_n(method):
    ball = G.Disk((0.0,) * 4, 1.0)  # fills pi^2 / 32 of its box: the first draw falls short
    x = pinn.sample(ball, 400, method, 1, np.float64)
    assert x.shape == (400, 4) and np.all(dist(x, ball.center) <= 1.0)


def test_box_boundary_points_are_uniform_by_face_length():
    box = G.Box((0.0, 0.0), (4.0, 1.0))
    b = box.boundary(2000, seed=5)
    assert np.all(on_square((b - [2.0, 0.5]) / [2.0, 0.5], tol=1e-12))
    short = np.isclose(b[:, 0], 0.0) | np.isclose(b[:, 0], 4.0)  # 2 of the perimeter's 10
    assert abs(short.mean() - 0.2) < 4 * math.sqrt(0.16 / 2000)
