"""Planning a run's memory before it starts: ``rlft estimate`` and the check before training.

* :mod:`rlft.planner.shape`: the model's sizes from its config alone (meta device, no weights);
* :mod:`rlft.planner.devices`: what a device holds (this machine, a GPU here, or a named one);
* :mod:`rlft.planner.phases`: the bytes each phase of a step keeps, per kind of job;
* :mod:`rlft.planner.estimate`: the peak over the phases, and whether it fits;
* :mod:`rlft.planner.advice`: the knobs to turn when it does not, least costly first.
"""
