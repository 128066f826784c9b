"""Identity through torch's Subset: a sampler's positions named as the samples of the dataset below."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import Subset, TensorDataset, random_split

from ddpcheck.checker.subsets import base_indices, to_base


def test_nested_subsets_compose_to_the_innermost_dataset() -> None:
    data = TensorDataset(torch.arange(10))
    outer = Subset(Subset(data, [9, 7, 5, 3, 1]), torch.tensor([4, 0, 2]))
    base = base_indices(outer)
    assert base is not None and list(base) == [1, 9, 5]
    assert to_base([0, 1, 2], base) == [1, 9, 5]
    assert [int(outer[i][0]) for i in range(3)] == list(base)  # what the dataset really returns


def test_random_split_positions_name_the_drawn_samples() -> None:
    train, _ = random_split(range(20), [0.5, 0.5], generator=torch.Generator().manual_seed(1))
    base = base_indices(train)
    assert base is not None and list(base) == [train[i] for i in range(len(train))]


def test_other_datasets_and_odd_indices_are_left_alone() -> None:
    assert base_indices(TensorDataset(torch.arange(3))) is None
    assert base_indices(Subset(list(range(5)), ["a", "b"])) is None  # not integer positions
    assert base_indices(Subset(list(range(5)), np.array([4, 2]))) is not None
    assert to_base([0, 7, "x"], base_indices(Subset(list(range(5)), [4, 2]))) == [4, 7, "x"]  # out of range
    assert to_base([3], None) == [3]


def test_an_hf_datasets_indices_mapping_names_rows() -> None:
    datasets = pytest.importorskip("datasets", reason="needs HF datasets: pip install -e '.[integrations]'")
    table = datasets.Dataset.from_dict({"row": list(range(20))})
    train = table.train_test_split(test_size=0.25, seed=3)["train"]
    base = base_indices(train)
    assert base is not None and list(base) == [int(train[i]["row"]) for i in range(len(train))]
    strided = table.shard(num_shards=4, index=1, contiguous=False)
    base = base_indices(Subset(strided, [2, 0]))  # a Subset over it composes with the mapping
    assert base is not None and list(base) == [9, 1]
    assert base_indices(table) is None  # no mapping: positions are rows
