"""ddpcheck: prove a PyTorch data pipeline is correct under DistributedDataParallel.

The reference utilities are re-exported here (``from ddpcheck import DDPSamplerWrapper``). The
checker is ``ddpcheck.runner.check_loader`` and the ``ddpcheck`` command line.
"""

from ddpcheck.reference import (
    DDPSamplerWrapper,
    check_loaders_is_patched,
    connect,
    disconnect,
    extract_loader_parameters,
    get_rank_safe,
    get_world_size_safe,
    is_ddp,
    is_main_process,
    move_to_device,
    mp_sync,
    mp_sync_dict,
    no_sync,
    patch_dataloader_to_ddp,
    sync_dicts_ddp,
    unwrap_model,
    wrap_model,
)

__version__ = "0.1.0"

__all__ = [
    "DDPSamplerWrapper",
    "__version__",
    "check_loaders_is_patched",
    "connect",
    "disconnect",
    "extract_loader_parameters",
    "get_rank_safe",
    "get_world_size_safe",
    "is_ddp",
    "is_main_process",
    "move_to_device",
    "mp_sync",
    "mp_sync_dict",
    "no_sync",
    "patch_dataloader_to_ddp",
    "sync_dicts_ddp",
    "unwrap_model",
    "wrap_model",
]
