"""Check ids, in report column order. Every report, the CLI and the plugin use these names."""

COVERAGE = "coverage"
NO_OVERLAP = "no_overlap"
PADDING_BOUND = "padding_bound"
EQUAL_STEPS = "equal_steps"
RESHUFFLE = "reshuffle"
DETERMINISM = "determinism"
BATCH_INTEGRITY = "batch_integrity"
WORKER_SHARDING = "worker_sharding"
SINGLE_PROCESS_EQUIVALENCE = "single_process_equivalence"
WORK_BALANCE = "work_balance"
PACKING = "packing"
MIXTURE = "mixture"
REPLICA_CONSISTENCY = "replica_consistency"
METRIC_EQUIVALENCE = "metric_equivalence"
TRAINING_EQUIVALENCE = "training_equivalence"
RESUME = "resume"
ELASTIC_RESUME = "elastic_resume"
# the training step (issue 35): what the step does with the data (ddpcheck run; supervision and
# rng_independence on loader files too, where data alone decides them)
STEP_EQUIVALENCE = "step_equivalence"
EQUAL_MICROSTEPS = "equal_microsteps"
SUPERVISION = "supervision"
RNG_INDEPENDENCE = "rng_independence"
STEP_CHECKS = (STEP_EQUIVALENCE, EQUAL_MICROSTEPS, SUPERVISION, RNG_INDEPENDENCE)
# RL prompt groups (issue 42): the copies of a prompt the single-process loader repeats stay one group in
# every step's gather (ddpcheck.checks.groups); a data check, judged wherever the loader is
PROMPT_GROUPS = "prompt_groups"

DATA_CHECKS = (
    COVERAGE,
    NO_OVERLAP,
    PADDING_BOUND,
    EQUAL_STEPS,
    RESHUFFLE,
    DETERMINISM,
    BATCH_INTEGRITY,
    WORKER_SHARDING,
    SINGLE_PROCESS_EQUIVALENCE,
    WORK_BALANCE,
    PACKING,
    MIXTURE,
    SUPERVISION,
    RNG_INDEPENDENCE,
    PROMPT_GROUPS,
)
# replica_consistency is judged per layout beside the data checks (ddpcheck.checks.replicas); the step's
# supervision and rng_independence are data checks too (loader files get them), judged from the step
# watcher's micro-steps and loop draws in a script (ddpcheck.checks.supervision, ddpcheck.checks.rng)
ALL_CHECKS = (
    *DATA_CHECKS[:4],
    REPLICA_CONSISTENCY,
    *DATA_CHECKS[4:],
    METRIC_EQUIVALENCE,
    TRAINING_EQUIVALENCE,
    STEP_EQUIVALENCE,
    EQUAL_MICROSTEPS,
    RESUME,
    ELASTIC_RESUME,
)

# Column labels for one-row-per-world-size tables, where full ids would not fit a terminal.
SHORT_LABELS = {
    COVERAGE: "cover",
    NO_OVERLAP: "overlap",
    PADDING_BOUND: "pad",
    EQUAL_STEPS: "steps",
    REPLICA_CONSISTENCY: "replica",
    RESHUFFLE: "shuffle",
    DETERMINISM: "determ",
    BATCH_INTEGRITY: "batches",
    WORKER_SHARDING: "workers",
    SINGLE_PROCESS_EQUIVALENCE: "1-proc",
    WORK_BALANCE: "work",
    PACKING: "packing",
    MIXTURE: "mixture",
    METRIC_EQUIVALENCE: "metric",
    TRAINING_EQUIVALENCE: "train",
    RESUME: "resume",
    ELASTIC_RESUME: "elastic",
    STEP_EQUIVALENCE: "step",
    EQUAL_MICROSTEPS: "micro",
    SUPERVISION: "superv",
    RNG_INDEPENDENCE: "rng",
    PROMPT_GROUPS: "groups",
}
