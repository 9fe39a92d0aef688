"""``rlft serve`` whose jobs are forked from a zygote, as the service tests run it:

    python tests/service/forking_serve.py serve --workspace WS --port N ...

The test starts this script forked from its own zygote, so torch and transformers are imported here
already; before the service starts any thread, the process forks itself into a zygote of its own
(:func:`tests.forked.become_a_zygote_parent`), and ``LocalPlacement.start_process`` starts each job from
it. A one-step tiny job is then ~1 s of work instead of ~7 s of imports and ~1 s of work. Everything
else is the service's own code; the tests of re-attaching to jobs after a restart run the real
``rlft serve`` (a forked job's ``/proc/PID/environ`` is its zygote's, without ``RLFT_JOB_ID``)."""

from __future__ import annotations

import sys

sys.path.pop(0)  # this file's folder: not on a job's path (the repository is, through PYTHONPATH)

from tests import forked  # noqa: E402

forked.become_a_zygote_parent()  # before rlft is imported: each job imports it afresh, as a real one does

from rlft.cli.main import main  # noqa: E402
from rlft.service.placement import LocalPlacement  # noqa: E402

LocalPlacement.start_process = staticmethod(forked.start_logged)
sys.exit(main(sys.argv[1:]))
