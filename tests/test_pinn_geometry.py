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
    b = g.boundary(3000, seed=1, dtype=np.float64)
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
    pts = u.boundary(2000, seed=3, dtype=np.float64)

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
    # a's outline outside b's interior, b's inside a
    db = d.boundary(500, seed=4, dtype=np.float64)
    assert np.all((on_edges(db, (0, 0), (2, 1)) & ~strictly_in(db, (1, 0.5), (3, 2)))
                  | (on_edges(db, (1, 0.5), (3, 2)) & np.all((db >= 0) & (db <= [2, 1]), 1)))


def test_a_ball_in_three_dimensions():
    ball = G.Disk((1.0, 0.0, -1.0), 2.0)
    assert math.isclose(ball.boundary_measure(), 4 * math.pi * 4.0)
    b = ball.boundary(500, seed=0, dtype=np.float64)
    np.testing.assert_allclose(dist(b, ball.center), 2.0, rtol=1e-14)
    x = pinn.sample(ball, 300, "sobol", 0, np.float64)
    assert x.shape == (300, 3) and np.all(dist(x, ball.center) <= 2.0)


def test_hammersley_against_its_definition():
    h = G.hammersley(8, 3, dtype=np.float64)
    np.testing.assert_array_equal(h[:, 0], np.arange(8) / 8)
    np.testing.assert_array_equal(h[:, 1], [0, .5, .25, .75, .125, .625, .375, .875])
    np.testing.assert_allclose(h[:, 2], np.array([0, 3, 6, 1, 4, 7, 2, 5]) / 9, rtol=1e-15)
    for i in (0, 1, 7, 123, 4097):  # the digits of i in base 5, reversed after the point
        digits = np.base_repr(i, 5)[::-1]
        want = sum(int(c) * 5.0 ** -(k + 1) for k, c in enumerate(digits)) if i else 0.0
        assert math.isclose(G.radical_inverse(i, 5), want, rel_tol=1e-15)
    box = pinn.Box((-1.0, 2.0, 0.0), (1.0, 3.0, 4.0))
    x = pinn.sample(box, 8, "hammersley", dtype=np.float64)
    np.testing.assert_allclose(x, box.low + G.hammersley(8, 3, np.float64) * (box.high - box.low))


@pytest.mark.parametrize("make,match", [
    (lambda: pinn.sample(G.Disk((0, 0), 1) | G.Disk((1000, 1000), 1), 10), "fills too little"),
    (lambda: (G.Disk((0, 0), 1) - G.Box((-2, -2), (2, 2))).boundary(10), "cannot give points"),
    (lambda: pinn.sample("disk", 10), "geometry must be a Box"),
    (lambda: G.Box((0, 0), (1, 1)) - G.Disk((0, 0, 0), 1), "dimensions 2 and 3"),
    (lambda: G.Disk((0, 0), -1.0), "radius must be a positive"),
    (lambda: pinn.sample(G.Box((0,), (1,)), 0), r"n must be an integer >= 1"),
    (lambda: pinn.sample(G.Box((0,), (1,)), 4, "halton"), "method must be one of"),
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
    b = box.boundary(2000, seed=5, dtype=np.float64)
    assert np.all(on_square((b - [2.0, 0.5]) / [2.0, 0.5], tol=1e-12))
    short = np.isclose(b[:, 0], 0.0) | np.isclose(b[:, 0], 4.0)  # 2 of the perimeter's 10
    assert abs(short.mean() - 0.2) < 4 * math.sqrt(0.16 / 2000)


# ------------------------------------------------- regularized set operations: exact boundaries

EPS = 1e-12


def on_rect(x, axis, value, ranges):
    """x on the axis-aligned rectangle {x_axis = value, other coordinates in `ranges`}."""
    others = [a for a in range(x.shape[1]) if a != axis]
    ok = np.abs(x[:, axis] - value) < EPS
    for a, (lo, hi) in zip(others, ranges):
        ok &= (x[:, a] >= lo - EPS) & (x[:, a] <= hi + EPS)
    return ok


def check_pieces(b, pieces, tol_sigma=4.0):
    """Every point on some piece (a bool mask per piece), and each piece's share of the
    points its share of the total measure (binomial, tol_sigma standard deviations)."""
    masks = np.array([m for m, _ in pieces])
    measures = np.array([w for _, w in pieces], np.float64)
    assert masks.any(0).all(), b[~masks.any(0)][:5]
    for mask, share in zip(masks, measures / measures.sum()):
        sigma = math.sqrt(share * (1 - share) / len(b))
        assert abs(mask.mean() - share) < tol_sigma * sigma, (mask.mean(), share)


def check_probes(g, probes):
    """probes: (point, inside, on_boundary) triples."""
    x = np.array([p for p, _, _ in probes], np.float64)
    np.testing.assert_array_equal(g.inside(x), [i for _, i, _ in probes])
    np.testing.assert_array_equal(g.on_boundary(x), [o for _, _, o in probes])
    np.testing.assert_array_equal(g.interior(x), [i and not o for _, i, o in probes])


def l_shape():
    return pinn.difference(G.Box([-1, -1], [1, 1]), G.Box([0, 0], [1, 1]))


def test_the_l_shape_has_six_sides_and_nothing_of_the_cut_box_beyond_them():
    g = l_shape()
    b = g.boundary(4000, seed=0, dtype=np.float64)
    assert b.shape == (4000, 2)
    check_pieces(b, [(on_rect(b, 1, -1, [(-1, 1)]), 2), (on_rect(b, 0, -1, [(-1, 1)]), 2),
                     (on_rect(b, 1, 1, [(-1, 0)]), 1), (on_rect(b, 0, 1, [(-1, 0)]), 1),
                     (on_rect(b, 0, 0, [(0, 1)]), 1), (on_rect(b, 1, 0, [(0, 1)]), 1)])
    assert not np.any((b[:, 0] > EPS) & (b[:, 1] > EPS))  # nothing in the cut quadrant
    assert g.on_boundary(b).all()
    check_probes(g, [((1, 0.5), False, False), ((0.5, 1), False, False), ((1, 1), False, False),
                     ((0.5, 0.5), False, False), ((0, 0.5), True, True), ((0.5, 0), True, True),
                     ((0, 0), True, True), ((1, 0), True, True), ((0, 1), True, True),
                     ((-1, -1), True, True), ((-0.5, 0.5), True, False),
                     ((1 + 1e-6, -0.5), False, False), ((-0.5, 1 - 1e-6), True, False)])


def test_boxes_sharing_a_face_make_one_box_and_shared_pieces_count_once():
    g = G.Box([0, 0], [1, 1]) | G.Box([1, 0], [3, 1])
    b = g.boundary(4000, seed=1, dtype=np.float64)
    assert not np.any(on_rect(b, 0, 1, [(EPS, 1 - EPS)]))  # the shared face is interior
    check_pieces(b, [(on_rect(b, 1, 0, [(0, 3)]), 3), (on_rect(b, 1, 1, [(0, 3)]), 3),
                     (on_rect(b, 0, 0, [(0, 1)]), 1), (on_rect(b, 0, 3, [(0, 1)]), 1)])
    check_probes(g, [((1, 0.5), True, False), ((1, 0), True, True), ((1, 1), True, True),
                     ((1, 1 + 1e-6), False, False), ((3, 0.5), True, True)])
    # overlapping boxes with a common bottom: [0.5, 1] of it is drawn once, not twice
    g = G.Box([0, 0], [1, 1]) | G.Box([0.5, 0], [2, 1])
    b = g.boundary(6000, seed=2, dtype=np.float64)
    check_pieces(b, [(on_rect(b, 1, 0, [(0, 0.5)]), 0.5), (on_rect(b, 1, 0, [(0.5, 1)]), 0.5),
                     (on_rect(b, 1, 0, [(1, 2)]), 1), (on_rect(b, 1, 1, [(0, 2)]), 2),
                     (on_rect(b, 0, 0, [(0, 1)]), 1), (on_rect(b, 0, 2, [(0, 1)]), 1)])


def test_a_box_minus_a_disk_touching_its_side():
    box, c, r = G.Box([0, 0], [2, 1]), np.array([1.0, 0.3]), 0.3
    g = box - G.Disk(c, r)  # the disk touches the side y = 0 at (1, 0) from within
    b = g.boundary(4000, seed=3, dtype=np.float64)
    circle = np.abs(dist(b, c) - r) < EPS

    def sides(b):
        return [(on_rect(b, 1, 0, [(0, 2)]), 2), (on_rect(b, 1, 1, [(0, 2)]), 2),
                (on_rect(b, 0, 0, [(0, 1)]), 1), (on_rect(b, 0, 2, [(0, 1)]), 1)]
    check_pieces(b, sides(b) + [(circle, 2 * math.pi * r)])
    check_probes(g, [((1, 0.3), False, False), ((1, 0.6), True, True), ((1, 0.1), False, False),
                     ((0.5, 0.5), True, False), ((0.5, 0), True, True)])
    # within tol of the circle is on the boundary, farther is not (tol measured from the
    # circle, not from the corners the tests probe)
    for side in (1, -1):
        near = c + (r + side * 0.8e-3) * np.array([[0.6, 0.8]])
        far = c + (r + side * 1.2e-3) * np.array([[0.6, 0.8]])
        assert g.on_boundary(near, tol=1e-3).all() and not g.on_boundary(far, tol=1e-3).any()
    outside = box - G.Disk([1.0, -0.3], 0.3)  # touching from outside: the box, unchanged
    b = outside.boundary(2000, seed=4, dtype=np.float64)
    check_pieces(b, sides(b))
    check_probes(outside, [((1, 0), True, True), ((1, 0.5), True, False)])


def test_intersections_are_the_common_part_with_its_own_boundary():
    half = G.Box([0, 0], [2, 1]) & G.Disk([1.0, 0.0], 1.0)  # the upper half disk
    b = half.boundary(4000, seed=5, dtype=np.float64)
    arc = (np.abs(dist(b, np.array([1.0, 0.0])) - 1) < 1e-8) & (b[:, 1] >= -EPS)
    check_pieces(b, [(on_rect(b, 1, 0, [(0, 2)]), 2), (arc, math.pi)])
    check_probes(half, [((1, 0.5), True, False), ((1, 1), True, True), ((1, 0), True, True),
                        ((0.1, 0.9), False, False), ((1, -0.5), False, False)])
    square = G.Box([0, 0], [2, 1]) & G.Box([1, 0], [3, 2])  # [1, 2] x [0, 1]
    b = square.boundary(4000, seed=6, dtype=np.float64)
    check_pieces(b, [(on_rect(b, 1, 0, [(1, 2)]), 1), (on_rect(b, 1, 1, [(1, 2)]), 1),
                     (on_rect(b, 0, 1, [(0, 1)]), 1), (on_rect(b, 0, 2, [(0, 1)]), 1)])
    check_probes(square, [((0.5, 0.5), False, False), ((2, 1.5), False, False),
                          ((1.5, 0.5), True, False), ((2, 1), True, True)])


def test_nested_three_dimensional_sets():
    # a cube less its upper corner, with a box glued on the face x = 2: the glued face is
    # interior, the corner's three faces on the cube are gone, its three inner faces appear
    g = (G.Box([0] * 3, [2] * 3) - G.Box([1] * 3, [2] * 3)) | G.Box([2, 0, 0], [3, 1, 1])
    b = g.boundary(8000, seed=7, dtype=np.float64)
    rects = [(0, 0, [(0, 2), (0, 2)], 4), (1, 0, [(0, 2), (0, 2)], 4), (1, 0, [(2, 3), (0, 1)], 1),
             (2, 0, [(0, 2), (0, 2)], 4), (2, 0, [(2, 3), (0, 1)], 1),
             (0, 2, [(0, 1), (1, 2)], 1), (0, 2, [(1, 2), (0, 1)], 1),
             (1, 2, [(0, 1), (0, 2)], 2), (1, 2, [(1, 2), (0, 1)], 1),
             (2, 2, [(0, 1), (0, 2)], 2), (2, 2, [(1, 2), (0, 1)], 1),
             (0, 1, [(1, 2), (1, 2)], 1), (1, 1, [(1, 2), (1, 2)], 1), (1, 1, [(2, 3), (0, 1)], 1),
             (2, 1, [(1, 2), (1, 2)], 1), (2, 1, [(2, 3), (0, 1)], 1), (0, 3, [(0, 1), (0, 1)], 1)]
    assert sum(r[3] for r in rects) == 28
    check_pieces(b, [(on_rect(b, axis, v, ranges), area) for axis, v, ranges, area in rects])
    check_probes(g, [((2, 0.5, 0.5), True, False), ((2, 1.5, 1.5), False, False),
                     ((1.5, 1.5, 1.5), False, False), ((1.5, 1.5, 2), False, False),
                     ((1, 1.5, 1.5), True, True), ((2, 0.5, 1.5), True, True),
                     ((1, 1, 1), True, True), ((2, 1, 1), True, True), ((3, 1, 1), True, True)])
    # a ball less an octant: 7/8 of the sphere and three quarter disks
    cut = G.Disk([0.0] * 3, 1.0) - G.Box([0] * 3, [2] * 3)
    b = cut.boundary(6000, seed=8, dtype=np.float64)
    sphere = (np.abs(dist(b, np.zeros(3)) - 1) < EPS) & (b <= EPS).any(1)
    quarters = [(np.abs(b[:, a]) < EPS) & (np.delete(b, a, 1) >= -EPS).all(1)
                & (dist(np.delete(b, a, 1), np.zeros(2)) <= 1 + EPS) for a in range(3)]
    check_pieces(b, [(sphere, 3.5 * math.pi)] + [(q, 0.25 * math.pi) for q in quarters])
    check_probes(cut, [((0.5, 0.5, 0.5), False, False), ((0, 0.5, 0.5), True, True),
                       ((-0.5, 0.5, 0.5), True, False), ((0.6, 0.6, 0.6), False, False)])


def _steady(tmp_path, outputs):
    path = tmp_path / f"steady{outputs}.dat"
    data = np.random.default_rng(0).random((4, 2 + outputs))
    np.savetxt(path, data, header="Model: synthetic\nx y u", comments="% ")
    return str(path)


def test_pinnacle_complex_geometries_boundaries(tmp_path):
    from hogrod.pinn import pinnacle as P
    step = P.pinnacle_ns2d_backstep(path=_steady(tmp_path, 3)).domain
    b = step.boundary(4000, seed=9, dtype=np.float64)
    check_pieces(b, [(on_rect(b, 1, 0, [(0, 4)]), 4), (on_rect(b, 0, 4, [(0, 2)]), 2),
                     (on_rect(b, 1, 2, [(2, 4)]), 2), (on_rect(b, 0, 2, [(1, 2)]), 1),
                     (on_rect(b, 1, 1, [(0, 2)]), 2), (on_rect(b, 0, 0, [(0, 1)]), 1)])
    check_probes(step, [((1, 1.5), False, False), ((0, 1.5), False, False), ((1, 1), True, True),
                        ((3, 1.5), True, False)])
    for factory, half, disks in [
            (P.pinnacle_poisson2d_classic, 0.5, [((sx * 0.3, sy * 0.3), 0.1) for sx in (1, -1)
                                                 for sy in (1, -1)]),
            (P.pinnacle_poisson_boltzmann2d, 1.0, [((0.5, 0.5), 0.2), ((0.4, -0.4), 0.4),
                                                   ((-0.2, -0.7), 0.1), ((-0.6, 0.5), 0.3)])]:
        domain = factory(path=_steady(tmp_path, 1)).domain
        b = domain.boundary(4000, seed=10, dtype=np.float64)
        square = on_square(b / half)
        circles = [(np.abs(dist(b, np.array(c)) - r) < EPS, 2 * math.pi * r) for c, r in disks]
        check_pieces(b, [(square, 8 * half)] + circles)


def test_every_sampler_returns_the_dtype_asked_for_and_floatx_by_default():
    import keras
    plate_, box = plate(), G.Box([0.0, 0.0], [1.0, 2.0])
    draws = {
        "sample box": lambda **k: pinn.sample(box, 16, "sobol", 0, **k),
        "sample plate": lambda **k: pinn.sample(plate_, 16, "uniform", 0, **k),
        "boundary box": lambda **k: box.boundary(16, 0, **k),
        "boundary disk": lambda **k: G.Disk([0.0, 0.0], 1.0).boundary(16, 0, **k),
        "boundary plate": lambda **k: plate_.boundary(16, 0, **k),
        "hammersley": lambda **k: G.hammersley(16, 2, **k),
    }
    old = keras.config.floatx()
    try:
        for floatx in ("float32", "float64"):
            keras.config.set_floatx(floatx)
            for name, draw in draws.items():
                assert draw().dtype == np.dtype(floatx), name
                for dtype in (np.float32, np.float64):
                    assert draw(dtype=dtype).dtype == dtype, name
            base = pinn.sample(box, 4, "uniform", 0)
            out = pinn.refine(base, lambda p: p[:, 0], box, candidates=64, add=8)
            assert out.dtype == np.dtype(floatx) and out.shape == (12, 2)
    finally:
        keras.config.set_floatx(old)
    x64 = pinn.sample(box, 8, "sobol", 0, dtype=np.float64)
    np.testing.assert_array_equal(pinn.sample(box, 8, "sobol", 0, dtype=np.float32),
                                  x64.astype(np.float32))
    with pytest.raises(ValueError, match="points have dtype float64 but dtype is float32"):
        pinn.refine(x64, lambda p: p[:, 0], box, candidates=16, add=2, dtype=np.float32)
    with pytest.raises(ValueError, match="dtype must be a floating dtype"):
        box.boundary(4, dtype="int32")


@pytest.mark.parametrize("make,match", [
    (lambda: G.Box([0] * 4, [1] * 4) | G.Box([1] * 4, [2] * 4), "up to 3-D"),
    (lambda: G.Box((0,), (1,)).boundary(2.5), r"n must be an integer >= 1"),
    (lambda: G.Box((0,), (1,)).on_boundary(np.zeros((1, 1)), tol=-1.0), "tol must be"),
    (lambda: pinn.sample(G.Box((0,), (1,)), 4, seed=-1), "seed must be"),
    (lambda: G.Box((0, 0), (1, 1)) | "box", "second operand must be a Box"),
    (lambda: G.hammersley(4, 0), "dim must be"),
])
def test_bad_arguments_name_themselves(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


def test_a_box_or_ball_alone_still_works_above_three_dimensions():
    ball = G.Disk([0.0] * 5, 1.0)
    b = ball.boundary(100, 0, dtype=np.float64)
    np.testing.assert_allclose(dist(b, np.zeros(5)), 1.0, rtol=1e-14)
    box = G.Box([0.0] * 5, [1.0] * 5)
    assert box.on_boundary(box.boundary(100, 0, dtype=np.float64)).all()


@pytest.mark.parametrize("method", ["uniform", "lhs", "sobol", "hammersley"])
def test_samplers_cover_the_domain_and_respect_bounds(method):
    box = pinn.Box((-1.0, 0.0), (1.0, 2.0))
    p = pinn.sample(box, 512, method, 3)
    assert p.shape == (512, 2) and p.dtype == np.float32
    assert np.all(p >= box.low) and np.all(p <= box.high)
    cells = np.floor((p - box.low) / (box.high - box.low) * 4).clip(0, 3).astype(int)
    assert len({tuple(c) for c in cells}) == 16  # every 4 x 4 cell gets points


def test_refinement_adds_points_where_the_residual_is_largest():
    box = pinn.Box((0.0,), (1.0,))
    base = pinn.sample(box, 10, "uniform", 0)
    out = pinn.refine(base, lambda p: np.exp(-100 * (p - 0.8) ** 2), box, candidates=1000,
                      add=50)
    assert out.shape == (60, 1)
    assert np.abs(out[10:, 0] - 0.8).max() < 0.1
