"""N-way K-shot episodes from class-grouped images: Omniglot's zips or any tfds data set.

An `ImageClasses` holds every image sorted by class (`images`, uint8 [n, h, w, 1]) and
the class boundaries (`offsets`, [num_classes + 1]), so classes of any size work.
`episodes(classes, n_way, k_shot, k_query, ...)` is an infinite tf.data stream of
meta-batches (x_support [T, N*K, h, w, 1], y_support [T, N*K], x_query, y_query) sampled
from stateless seeds: N distinct classes, K + Q distinct images of each, support and query
disjoint, labels 0..N-1 in a fresh random order per episode.

Omniglot as in the MAML paper: 28x28, characters shuffled with a fixed seed, the first 1,200
for meta-training and the remaining 423 for testing, each character rotated by 0, 90, 180
and 270 degrees to make four classes.
"""

import collections
import io
import os
import zipfile
import zlib
from typing import NamedTuple, Optional

import gin
import numpy as np
import tensorflow as tf

from hogrod import checks
from hogrod import data as hogrod_data

__all__ = ["ImageClasses", "load_omniglot", "omniglot_characters", "load_tfds_classes",
           "episodes", "OMNIGLOT_ZIPS"]



class ImageClasses(NamedTuple):
    """Images sorted by class, the classes of an N-way K-shot benchmark.

    Attributes:
      images: every image, sorted by class, uint8 [n, h, w, 1] (Omniglot: strokes 255,
        background 0).
      offsets: the class boundaries, int [num_classes + 1]: class c is
        `images[offsets[c]:offsets[c + 1]]`, so classes of any size work.
      rotations: each class counts as this many classes, its images rotated by 0, 90, ...
        degrees (Omniglot: 4; a tfds set: 1).
    """

    images: np.ndarray
    offsets: np.ndarray
    rotations: int

OMNIGLOT_ZIPS = ("images_background.zip", "images_evaluation.zip")


OMNIGLOT_SOURCE = ("https://github.com/brendenlake/omniglot (python/images_background.zip and "
                   "python/images_evaluation.zip)")


def _check_omniglot_dir(data_dir, binding):
    missing = [z for z in OMNIGLOT_ZIPS if not os.path.exists(os.path.join(data_dir, z))]
    if missing:
        raise FileNotFoundError(
            f"Omniglot data dir '{data_dir}' lacks {missing}: set the binding "
            f"{binding}, or {hogrod_data.ENV} (its "
            f"omniglot/ folder), to a folder holding the two original zips "
            f"{list(OMNIGLOT_ZIPS)}, from {OMNIGLOT_SOURCE}")


def _read_omniglot(data_dir, size):
    from PIL import Image  # matplotlib's dependency; only needed here
    characters = []
    for name in OMNIGLOT_ZIPS:
        path = os.path.join(data_dir, name)
        try:
            characters += _read_zip(path, size, Image)
        except (zipfile.BadZipFile, EOFError, zlib.error) as e:
            raise ValueError(f"{path} is not a readable zip ({e}); it is truncated or "
                             f"corrupt: download it again from {OMNIGLOT_SOURCE}") from None
    return characters


def _read_zip(path, size, Image):
    characters = []
    with zipfile.ZipFile(path) as z:
        by_char = collections.defaultdict(list)
        for f in sorted(z.namelist()):
            if f.endswith(".png"):
                by_char[os.path.dirname(f)].append(f)
        for char in sorted(by_char):
            imgs = []
            for f in by_char[char]:
                img = Image.open(io.BytesIO(z.read(f))).convert("L").resize(
                    (size, size), Image.LANCZOS)
                imgs.append(np.asarray(img, np.uint8))
            characters.append(np.stack(imgs))
    return characters


_ALPHABETS = ("all", "background", "evaluation")


def omniglot_characters(data_dir: Optional[str] = None, image_size: int = 28,
                        alphabets: str = "all", cache_dir: Optional[str] = None,
                        binding: str = "load_omniglot's data_dir") -> list:
    """Omniglot's characters from the original zips in `data_dir`, in the zips' order.

    Decoding 32,460 PNGs takes a minute; the resized array is cached as
    `<cache_dir>/omniglot_<size>.npz`, never in the repository. Each 105x105 drawing is
    resized (Lanczos) to `image_size` and inverted so strokes are 255 and background 0.

    Args:
      data_dir: the folder holding the two original zips (`OMNIGLOT_ZIPS`); None is
        `$HOGROD_DATA/omniglot` (see `hogrod.data`).
      image_size: the side of the square images, in pixels (the MAML paper: 28).
      alphabets: 'all' (background then evaluation characters), 'background' (the 964
        characters of images_background.zip) or 'evaluation' (the 659 of
        images_evaluation.zip).
      cache_dir: where the decoded array is cached (None: ~/.cache/hogrod).
      binding: what sets `data_dir` (the caller's gin binding or argument), named in the
        errors.

    Returns:
      A list of uint8 arrays [drawings, image_size, image_size], one per character, the
      characters sorted by alphabet and name within each zip, the drawings by file name.

    Raises:
      ValueError: neither `data_dir` nor HOGROD_DATA given (naming `binding`), an
        `alphabets` not listed above, or an unreadable zip.
      FileNotFoundError: `data_dir` lacks a zip (naming where to get it).
    """
    checks.choice(alphabets, _ALPHABETS, "alphabets", "omniglot_characters")
    data_dir = hogrod_data.data_dir("omniglot", binding, data_dir)
    cache_dir = cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "hogrod")
    cache = os.path.join(cache_dir, f"omniglot_{image_size}.npz")
    _check_omniglot_dir(data_dir, binding)  # a wrong data_dir is an error even when cached
    if os.path.exists(cache):
        chars = list(np.load(cache)["chars"])
    else:
        chars = _read_omniglot(data_dir, image_size)
        if len({c.shape for c in chars}) == 1:
            os.makedirs(cache_dir, exist_ok=True)
            np.savez_compressed(cache, chars=np.stack(chars))
    chars = [255 - c for c in chars]
    if alphabets == "all":
        return chars
    background = _count_characters(os.path.join(data_dir, OMNIGLOT_ZIPS[0]))
    return chars[:background] if alphabets == "background" else chars[background:]


def _count_characters(path):
    """The characters (folders holding PNGs) of one zip, read from its directory alone."""
    try:
        with zipfile.ZipFile(path) as z:
            return len({os.path.dirname(f) for f in z.namelist() if f.endswith(".png")})
    except (zipfile.BadZipFile, EOFError, zlib.error) as e:
        raise ValueError(f"{path} is not a readable zip ({e}); it is truncated or "
                         f"corrupt: download it again from {OMNIGLOT_SOURCE}") from None


@gin.configurable
def load_omniglot(data_dir: Optional[str] = None, split: str = "train", image_size: int = 28,
                  train_characters: int = 1200, seed: int = 1,
                  cache_dir: Optional[str] = None) -> ImageClasses:
    """Omniglot from the original zips in `data_dir`, split as in the MAML paper.

    The characters are `omniglot_characters`' (cached decoded), strokes 255 (1 after
    `episodes` scales them) and background 0.

    Args:
      data_dir: the folder holding the two original zips (`OMNIGLOT_ZIPS`); None is
        `$HOGROD_DATA/omniglot` (see `hogrod.data`).
      split: 'train' (the first `train_characters` characters of a fixed shuffle) or
        'test' (the rest).
      image_size: the side of the square images, in pixels (the MAML paper: 28).
      train_characters: how many characters are meta-training ones (the MAML paper:
        1,200 of 1,623).
      seed: the seed of the characters' shuffle (the split).
      cache_dir: where the decoded array is cached (None: ~/.cache/hogrod).

    Returns:
      the split's characters, each rotated by 0, 90, 180 and 270 degrees into four classes
      (`rotations=4`).

    Raises:
      ValueError: neither `data_dir` nor HOGROD_DATA given (naming the binding
        `episode_data.data_dir`), a `split` other than 'train' or 'test', or an unreadable
        zip.
      FileNotFoundError: `data_dir` lacks a zip (naming where to get it).
    """
    chars = omniglot_characters(data_dir, image_size, "all", cache_dir,
                                "episode_data.data_dir (or load_omniglot's data_dir)")
    order = np.random.default_rng(seed).permutation(len(chars))
    if split not in ("train", "test"):
        raise ValueError(f"load_omniglot.split must be 'train' or 'test', got {split!r}")
    chosen = order[:train_characters] if split == "train" else order[train_characters:]
    images = np.concatenate([chars[i] for i in chosen])[..., None]
    offsets = np.concatenate([[0], np.cumsum([len(chars[i]) for i in chosen])])
    return ImageClasses(images, offsets, rotations=4)


def load_tfds_classes(name: str, split: str = "train", image_key: str = "image",
                      label_key: str = "label", image_size: Optional[int] = None,
                      data_dir: Optional[str] = None) -> ImageClasses:
    """Any tfds image classification set, grouped by its label feature.

    Needs `tensorflow_datasets` (not a dependency of hogrod). RGB images are averaged to
    one channel; only the first channel of any other is kept.

    Args:
      name: the tfds name of the data set (e.g. 'omniglot', 'mnist').
      split: the tfds split to load.
      image_key: the feature holding the image.
      label_key: the feature holding the integer class label.
      image_size: None (keep the size), or the side the images are resized to.
      data_dir: tfds's data directory (None: its default).

    Returns:
      the images grouped by label (labels with no image dropped), `rotations=1`.
    """
    import tensorflow_datasets as tfds
    ds = tfds.load(name, split=split, data_dir=data_dir)
    images, labels = [], []
    for ex in ds.as_numpy_iterator():
        img = ex[image_key]
        if image_size:
            img = tf.image.resize(img, (image_size, image_size)).numpy()
        if img.ndim == 3 and img.shape[-1] == 3:
            img = img.mean(-1, keepdims=True)
        images.append(np.asarray(img, np.uint8).reshape(img.shape[0], img.shape[1], -1)[..., :1])
        labels.append(int(ex[label_key]))
    order = np.argsort(labels, kind="stable")
    labels = np.asarray(labels)[order]
    counts = np.bincount(labels)
    counts = counts[counts > 0]
    offsets = np.concatenate([[0], np.cumsum(counts)])
    return ImageClasses(np.stack(images)[order], offsets, rotations=1)


def episodes(classes: ImageClasses, n_way: int = 5, k_shot: int = 1, k_query: int = 15,
             meta_batch_size: int = 32, seed: int = 0) -> tf.data.Dataset:
    """An infinite stream of N-way K-shot meta-batches (see the module docstring).

    Each episode takes N distinct classes (a rotation of a class counts as a class), K + Q
    distinct images of each, support and query disjoint, labels 0..N-1 in a fresh random
    order; sampled from stateless seeds, so the stream is deterministic given `seed`.

    Args:
      classes: the images grouped by class (`load_omniglot`, `load_tfds_classes`).
      n_way: classes per episode, N (>= 1, at most the classes available).
      k_shot: support images per class, K (>= 1).
      k_query: query images per class, Q (>= 1; K + Q at most the smallest class's size).
      meta_batch_size: episodes per meta-batch, T (>= 1).
      seed: the stream's integer seed; meta-batch i comes from (seed, i).

    Returns:
      a `tf.data.Dataset` of (x_support [T, N*K, h, w, 1] float32 in [0, 1],
      y_support [T, N*K] int32, x_query [T, N*Q, h, w, 1], y_query [T, N*Q]).

    Raises:
      ValueError: a count below 1, more classes than available, or K + Q more than the
        smallest class holds.
    """
    offsets = np.asarray(classes.offsets)
    sizes = np.diff(offsets)
    num_classes = len(sizes) * classes.rotations
    for name, value in (("n_way", n_way), ("k_shot", k_shot), ("k_query", k_query),
                        ("meta_batch_size", meta_batch_size)):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    if n_way > num_classes:
        raise ValueError(f"n_way={n_way} is more than the {num_classes} classes available")
    if k_shot + k_query > sizes.min():
        raise ValueError(f"k_shot + k_query = {k_shot + k_query} is more than the "
                         f"{sizes.min()} examples of the smallest class")
    images = tf.constant(classes.images)
    offsets_t = tf.constant(offsets, tf.int64)
    rotations = classes.rotations
    per = k_shot + k_query

    def one_episode(seed_pair):
        s = tf.random.experimental.stateless_split(seed_pair, n_way + 2)
        chosen = tf.argsort(tf.random.stateless_uniform([num_classes], s[0]))[:n_way]
        labels = tf.argsort(tf.random.stateless_uniform([n_way], s[1]))
        xs, xq = [], []
        for i in range(n_way):
            c = tf.cast(chosen[i], tf.int64)
            base, rot = c // rotations, c % rotations
            start, size = offsets_t[base], offsets_t[base + 1] - offsets_t[base]
            pick = tf.argsort(tf.random.stateless_uniform([size], s[2 + i]))[:per]
            imgs = tf.gather(images, start + tf.cast(pick, tf.int64))
            imgs = tf.image.rot90(imgs, tf.cast(rot, tf.int32))
            xs.append(imgs[:k_shot])
            xq.append(imgs[k_shot:])
        ys = tf.repeat(labels, k_shot)
        yq = tf.repeat(labels, k_query)
        to_float = lambda t: tf.cast(tf.concat(t, 0), tf.float32) / 255.0  # noqa: E731
        return to_float(xs), ys, to_float(xq), yq

    def meta_batch(i):
        seeds = tf.random.experimental.stateless_split(tf.stack([tf.cast(seed, tf.int64), i]),
                                                       meta_batch_size)
        return tf.map_fn(one_episode, seeds, fn_output_signature=(
            tf.float32, tf.int32, tf.float32, tf.int32))

    return tf.data.Dataset.range(2**62).map(meta_batch,
                                            num_parallel_calls=tf.data.AUTOTUNE).prefetch(2)
