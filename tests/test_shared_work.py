"""Sharing seeded permutations across simulated ranks must be invisible to the code that draws them."""

from __future__ import annotations

import torch
from torch.utils.data import DistributedSampler, RandomSampler

from ddpcheck.launch.shared_work import shared_permutations


def _draws(seed: int) -> tuple[list[int], list[int]]:
    g = torch.Generator()
    g.manual_seed(seed)
    first = torch.randperm(50, generator=g).tolist()
    after = torch.randint(0, 10**6, (5,), generator=g).tolist()  # the generator's later state matters
    return first, after


def test_shared_draws_equal_real_draws_and_leave_the_generator_where_the_real_call_would() -> None:
    expected = _draws(3)
    with shared_permutations() as shared:
        assert _draws(3) == expected
        assert _draws(3) == expected  # served from the cache this time
        assert _draws(4) != expected
    assert shared.hits == 1
    assert _draws(3) == expected  # torch is restored


def test_every_caller_gets_its_own_list() -> None:
    with shared_permutations():
        g = torch.Generator()
        g.manual_seed(0)
        first = torch.randperm(10, generator=g).tolist()
        first.append(-1)
        g.manual_seed(0)
        second = torch.randperm(10, generator=g).tolist()
    assert second == first[:-1]


def test_a_permutation_modified_in_place_is_recomputed() -> None:
    with shared_permutations():
        g = torch.Generator()
        g.manual_seed(0)
        perm = torch.randperm(10, generator=g)
        clean = perm.tolist()
        perm.zero_()
        g.manual_seed(0)
        assert torch.randperm(10, generator=g).tolist() == clean


def test_distributed_and_random_samplers_yield_the_same_streams_with_sharing() -> None:
    def streams() -> list[list[int]]:
        out = []
        for rank in range(4):
            sampler = DistributedSampler(range(103), num_replicas=4, rank=rank, shuffle=True, seed=5)
            sampler.set_epoch(1)
            out.append(list(sampler))
        g = torch.Generator()
        g.manual_seed(9)
        out.append(list(RandomSampler(range(30), generator=g)))
        return out

    expected = streams()
    with shared_permutations() as shared:
        assert streams() == expected
    assert shared.hits == 3  # ranks 1-3 reuse rank 0's permutation
