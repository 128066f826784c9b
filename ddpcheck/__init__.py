"""ddpcheck: prove a PyTorch data pipeline is correct under DistributedDataParallel.

The reference utilities are re-exported here (``from ddpcheck import DDPSamplerWrapper``). The
checker is ``ddpcheck.session.check_loader`` and the ``ddpcheck`` command line. Re-exports resolve
lazily, so importing ``ddpcheck`` (as pytest does for the plugin entry point) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "DDPSamplerWrapper": "ddpcheck.reference.sampler",
    "patch_dataloader_to_ddp": "ddpcheck.reference.patch",
    "extract_loader_parameters": "ddpcheck.reference.patch",
    "check_loaders_is_patched": "ddpcheck.reference.patch",
    "sync_dicts_ddp": "ddpcheck.reference.sync",
    "mp_sync": "ddpcheck.reference.sync",
    "mp_sync_dict": "ddpcheck.reference.sync",
    "is_ddp": "ddpcheck.reference.dist",
    "get_world_size_safe": "ddpcheck.reference.dist",
    "get_rank_safe": "ddpcheck.reference.dist",
    "is_main_process": "ddpcheck.reference.dist",
    "connect": "ddpcheck.reference.dist",
    "data_parallel_rank": "ddpcheck.reference.dist",
    "data_parallel_world_size": "ddpcheck.reference.dist",
    "disconnect": "ddpcheck.reference.dist",
    "wrap_model": "ddpcheck.reference.model",
    "unwrap_model": "ddpcheck.reference.model",
    "no_sync": "ddpcheck.reference.model",
    "move_to_device": "ddpcheck.reference.model",
    "assert_ddp_safe": "ddpcheck.pytest_plugin",
    "check_loader": "ddpcheck.session",
    "check_script": "ddpcheck.session.script",
    "judge_directory": "ddpcheck.session.script",
    "ScriptOptions": "ddpcheck.session.script",
    "CheckOptions": "ddpcheck.options",
    "BadInput": "ddpcheck.options",
    "CheckResult": "ddpcheck.result",
    "WorldResult": "ddpcheck.result",
    "Verdict": "ddpcheck.verdict",
    "Interrupted": "ddpcheck.session.run",
}

__all__ = ["__version__", *_EXPORTS]

if TYPE_CHECKING:
    from ddpcheck.options import BadInput, CheckOptions
    from ddpcheck.pytest_plugin import assert_ddp_safe
    from ddpcheck.reference.dist import (
        connect,
        data_parallel_rank,
        data_parallel_world_size,
        disconnect,
        get_rank_safe,
        get_world_size_safe,
        is_ddp,
        is_main_process,
    )
    from ddpcheck.reference.model import move_to_device, no_sync, unwrap_model, wrap_model
    from ddpcheck.reference.patch import (
        check_loaders_is_patched,
        extract_loader_parameters,
        patch_dataloader_to_ddp,
    )
    from ddpcheck.reference.sampler import DDPSamplerWrapper
    from ddpcheck.reference.sync import mp_sync, mp_sync_dict, sync_dicts_ddp
    from ddpcheck.result import CheckResult, WorldResult
    from ddpcheck.session import check_loader
    from ddpcheck.session.run import Interrupted
    from ddpcheck.session.script import ScriptOptions, check_script, judge_directory
    from ddpcheck.verdict import Verdict


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ddpcheck' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
