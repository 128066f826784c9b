"""The session: the plan of a run and carrying it out, above the scenarios and the rank side.

``plan`` decides which layouts run, what each records and which reruns (pure, nothing launched);
``record`` turns jobs into process groups and group results into traces; ``run`` carries a plan out
(the reference, each layout's checks and scenarios) into a :class:`~ddpcheck.result.CheckResult`; and
``joined`` does the same inside an existing torchrun/SLURM launch. The entry point is
:func:`check_loader` (also ``ddpcheck.check_loader``).
"""

from ddpcheck.session.run import Interrupted, check_loader

__all__ = ["Interrupted", "check_loader"]
