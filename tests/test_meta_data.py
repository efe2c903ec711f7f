"""Episodes from a tfds image classification set (`tfds.testing.mock_data`, no download):
the class grouping matches the labels, and episodes keep their invariants; a K larger than
the smallest class is a clear error naming it."""

import numpy as np
import pytest
import tensorflow_datasets as tfds

from hogrod import meta


def test_tfds_classes_are_grouped_by_label_and_give_valid_episodes():
    with tfds.testing.mock_data(num_examples=60):
        classes = meta.load_tfds_classes("mnist", "train")
        labels = [int(ex["label"]) for ex in tfds.load("mnist", split="train")
                  .as_numpy_iterator()]
    counts = np.bincount(labels)
    assert classes.images.shape == (60, 28, 28, 1)
    np.testing.assert_array_equal(np.diff(classes.offsets), counts[counts > 0])
    smallest = int(np.diff(classes.offsets).min())
    xs, ys, xq, yq = next(iter(meta.episodes(classes, n_way=4, k_shot=1,
                                             k_query=smallest - 1, meta_batch_size=3)))
    assert xs.shape == (3, 4, 28, 28, 1) and xq.shape == (3, 4 * (smallest - 1), 28, 28, 1)
    flat = classes.images.reshape(60, -1).astype(np.float32) / 255.0

    def source(images):  # (index in the grouped set, its class) of each episode image
        idx = [int(np.argmin(np.abs(flat - im.reshape(-1)).sum(1))) for im in images.numpy()]
        return idx, np.searchsorted(classes.offsets, idx, side="right") - 1

    for t in range(3):
        assert sorted(ys[t].numpy()) == [0, 1, 2, 3]
        assert np.bincount(yq[t].numpy()).tolist() == [smallest - 1] * 4
        s_idx, s_cls = source(xs[t])
        q_idx, q_cls = source(xq[t])
        assert not set(s_idx) & set(q_idx) and len(set(q_idx)) == len(q_idx)
        assert len(set(s_cls)) == 4  # N distinct classes, one per label in support and query
        for label in range(4):
            assert set(q_cls[yq[t].numpy() == label]) == set(s_cls[ys[t].numpy() == label])
    with pytest.raises(ValueError, match="examples of the smallest class"):
        meta.episodes(classes, n_way=4, k_shot=1, k_query=smallest)


def test_a_model_whose_outputs_do_not_match_n_way_is_named(tmp_path):
    from experiments import maml as exp
    from hogrod import harness
    with tfds.testing.mock_data(num_examples=60):
        with pytest.raises(ValueError, match="5 outputs but the episodes are 3-way"):
            harness.run(exp.maml_experiment, ["configs/maml/omniglot_5way_1shot.gin"],
                        ["episode_data.source = 'mnist'", "episode_data.n_way = 3",
                         "episode_data.k_query = 1", "episode_data.eval_tasks = 2",
                         "episode_data.meta_batch_size = 2"], str(tmp_path))


def test_missing_omniglot_names_the_binding_and_where_the_zips_come_from(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        meta.load_omniglot(str(tmp_path), cache_dir=str(tmp_path / "cache"))
    for text in ("episode_data.data_dir", "brendenlake/omniglot", "python/images_background.zip",
                 "images_evaluation.zip"):
        assert text in str(e.value)


def test_a_truncated_omniglot_zip_is_named_with_what_to_do(tmp_path):
    import zipfile
    from PIL import Image
    for name in ("images_background.zip", "images_evaluation.zip"):
        with zipfile.ZipFile(tmp_path / name, "w") as z:  # one 2-image character each
            for i in range(2):
                image = tmp_path / "a.png"
                Image.new("L", (105, 105), 255 * i).save(image)
                z.write(image, f"{name[:-4]}/Alphabet/character01/{i}.png")
    meta.load_omniglot(str(tmp_path), "test", 28, train_characters=1,
                       cache_dir=str(tmp_path / "ok"))  # intact: reads
    data = (tmp_path / "images_evaluation.zip").read_bytes()
    (tmp_path / "images_evaluation.zip").write_bytes(data[:len(data) // 2])
    with pytest.raises(ValueError) as e:
        meta.load_omniglot(str(tmp_path), "test", 28, train_characters=1,
                           cache_dir=str(tmp_path / "cache"))
    assert str(tmp_path / "images_evaluation.zip") in str(e.value)
    assert "download it again" in str(e.value) and "brendenlake/omniglot" in str(e.value)
