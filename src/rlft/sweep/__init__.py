"""``rlft sweep``: batch experiments on the job service's store and runner.

    plan.py      the runs: a folder of configs or a base config times a --grid, validated up front
    registry.py  the job store as the sweep's registry: one row per attempt
    execute.py   the loop: Runner launches the processes; retries, --fail-fast, --resume
    failures.py  the failure classes and which of them a retry can fix (torch-free)
    metrics.py   each run's final and best main metrics
    summary.py   summary.csv / summary.md / errors.md, the terminal table, the overlaid plots

Nothing here imports torch or a model: each run is its own ``rlft train`` (``sft`` ...) process.
"""
