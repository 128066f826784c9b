"""The rank side: what runs inside every rank to record what it sees.

One face for every rank-side run: :class:`~ddpcheck.checker.recipe.LoaderRecipe` (how a loader is built,
made once from the options) and :func:`~ddpcheck.checker.face.open_loader`, which returns an
:class:`~ddpcheck.checker.face.OpenedLoader` (module, hooks, facts, ``set_epoch``, batches with ids,
``restart``); ``OpenedLoader.wrap`` opens a loader a training script built. Each job in a module:
``loaderfile`` (the loader file's contract), ``hooks`` (its hooks, resumable state), ``facts`` (what a
loader says of itself), ``epochs`` (set_epoch as a loop calls it), ``batches`` with ``identity`` and
``index_log`` (which samples each batch holds), ``running`` (epochs and windows, their guards),
``recording`` (a rank's :class:`~ddpcheck.trace.RankTrace`), ``script`` (a training script's loaders
recorded) with ``watch`` (torch's DataLoader watched), ``frames`` (which code is the user's) and
``script_env`` (the script run in a rank), ``work`` and ``mixture`` (what batches cost, where samples
come from), and ``options`` (what a run is asked to do). The orchestration above it lives in
:mod:`ddpcheck.session`.
"""
