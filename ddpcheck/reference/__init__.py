"""What production code imports: shard samplers, patch loaders, sync results, connect, wrap models.

Depends on torch only and knows nothing of the checker. Names and defaults follow
open-metric-learning's ``oml.ddp``, so code written against OML works by changing the import.
"""

from ddpcheck.reference.dist import (
    ConnectionInfo,
    LaunchEnv,
    connect,
    data_parallel_rank,
    data_parallel_world_size,
    detect_launch,
    disconnect,
    get_rank_safe,
    get_world_size_safe,
    is_ddp,
    is_main_process,
    parse_slurm_nodelist,
)
from ddpcheck.reference.iterable import ShardedIterableDataset
from ddpcheck.reference.model import move_to_device, no_sync, unwrap_model, wrap_model
from ddpcheck.reference.patch import (
    check_loaders_is_patched,
    extract_loader_parameters,
    patch_dataloader_to_ddp,
)
from ddpcheck.reference.sampler import DDPSamplerWrapper, SyncOrder
from ddpcheck.reference.sync import WarningDDP, merge_list_of_dicts, mp_sync, mp_sync_dict, sync_dicts_ddp

__all__ = [
    "ConnectionInfo",
    "DDPSamplerWrapper",
    "LaunchEnv",
    "ShardedIterableDataset",
    "SyncOrder",
    "WarningDDP",
    "check_loaders_is_patched",
    "connect",
    "data_parallel_rank",
    "data_parallel_world_size",
    "detect_launch",
    "disconnect",
    "extract_loader_parameters",
    "get_rank_safe",
    "get_world_size_safe",
    "is_ddp",
    "is_main_process",
    "merge_list_of_dicts",
    "move_to_device",
    "mp_sync",
    "mp_sync_dict",
    "no_sync",
    "parse_slurm_nodelist",
    "patch_dataloader_to_ddp",
    "sync_dicts_ddp",
    "unwrap_model",
    "wrap_model",
]
