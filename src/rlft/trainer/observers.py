"""What watches a run from beside it: the heartbeat in run.json, the console and file logs, the resource
monitor and the experiment trackers. The trainer opens them once the run directory exists and stops them
whichever way the run ends."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlft.config.loader import config_to_dict, config_to_yaml
from rlft.config.schema import RunConfig
from rlft.distributed.context import Dist
from rlft.logging.console import attach_file_log, get_logger, setup_console_logging
from rlft.logging.resources import ResourceMonitor
from rlft.logging.run_dir import RunDirectory
from rlft.logging.trackers import Trackers, open_trackers
from rlft.planner.devices import cpu_memory_limit
from rlft.trainer.process import Heartbeat, on_cuda


@dataclass
class Observers:
    """The run's watchers, each started; :meth:`stop` and :meth:`detach_log` end them."""

    heartbeat: Heartbeat
    log: logging.Logger
    file_log: logging.Handler | None  # None on the processes of a data-parallel run other than rank 0
    resources: ResourceMonitor
    trackers: Trackers

    @classmethod
    def open(cls, cfg: RunConfig, run_dir: RunDirectory, dist: Dist, resume_step: int | None, memory: Any) -> Observers:
        """Start them all and write the config in effect (a resume reopens run.json's tracker runs).
        ``memory``: the run's memory plan (:func:`rlft.planner.check.check_memory`), whose first knob the
        resource monitor names when memory runs short; None when none was made."""
        heartbeat = Heartbeat(run_dir).__enter__()
        log = setup_console_logging(rank=dist.rank if dist.enabled else None)
        file_log = attach_file_log(run_dir.log if dist.is_main else None)
        resources = ResourceMonitor(
            run_dir.root / "resources.jsonl" if dist.is_main else Path(os.devnull),
            cuda=on_cuda(cfg.model.device),
            memory_limit=cpu_memory_limit(),
            first_knob=memory.if_out_of_memory[0] if memory and memory.if_out_of_memory else None,
            log=get_logger(),
        ).__enter__()
        trackers = Trackers()
        if dist.is_main:
            run_dir.write_config(config_to_yaml(cfg))  # the config in effect; each checkpoint keeps its own
            info = run_dir.read_run_info().get("trackers")
            name = run_dir.root.name
            trackers = open_trackers(cfg.train.report_to, run_dir.root, config_to_dict(cfg), name, info, resume_step)
        if trackers.ids:
            run_dir.write_run_info(trackers=trackers.ids)
        return cls(heartbeat, log, file_log, resources, trackers)

    def stop(self, status: str) -> None:
        """Close the trackers with the run's final status, then stop the heartbeat and the resource monitor."""
        self.trackers.close(status)
        self.heartbeat.__exit__(None, None, None)
        self.resources.__exit__(None, None, None)

    def detach_log(self) -> None:
        """Stop mirroring log lines into the run's file (an API user may start another run in this process)."""
        if self.file_log is not None:
            get_logger().removeHandler(self.file_log)
            self.file_log.close()
