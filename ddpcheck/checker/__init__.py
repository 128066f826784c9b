"""The rank side: what runs inside every rank to record what it sees.

``loaderfile`` is the loader file's contract (factory, hooks), ``identity`` and ``index_log`` say which
sample each batch holds, ``recording`` is what a rank runs (build the loader, iterate epochs like a
training loop, record a :class:`~ddpcheck.trace.RankTrace`), and ``options`` what a run is asked to do.
The orchestration above it lives in :mod:`ddpcheck.session`.
"""
