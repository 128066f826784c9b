"""The run: a loader file and options in, a :class:`~ddpcheck.result.CheckResult` out.

``loaderfile`` is the file's contract (factory, hooks), ``identity`` and ``index_log`` say which sample
each batch holds, ``recording`` is what a rank runs (build the loader, iterate epochs, record a
:class:`~ddpcheck.trace.RankTrace`), ``options`` what a run is asked to do, ``runner`` the orchestration
(launch, traces, checks, scenarios) and ``joined`` the same inside an existing torchrun/SLURM launch.
The entry point is :func:`ddpcheck.checker.runner.check_loader` (also ``ddpcheck.check_loader``).
"""
