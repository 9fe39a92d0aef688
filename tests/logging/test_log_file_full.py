"""train_log.log on a full disk: one line on stderr, then no more attempts, never a traceback per line."""

from __future__ import annotations

from rlft.logging.console import attach_file_log, get_logger, setup_console_logging
from tests.logging.full_disk import _FullFile


def test_a_full_disk_stops_the_log_file_with_one_line_and_no_traceback(tmp_path, capsys):
    setup_console_logging()
    log = tmp_path / "train_log.log"
    handler = attach_file_log(log)
    try:
        get_logger().info("before the disk fills")
        handler.stream.close()
        handler.stream = _FullFile(open(log, "a", encoding="utf-8"))  # the disk fills up under the open file
        for i in range(5):
            get_logger().info(f"line {i}")
    finally:
        get_logger().removeHandler(handler)
        handler.close()
    err = capsys.readouterr().err
    assert "Logging error" not in err and "Traceback" not in err
    assert err.count("stopped mirroring the log into") == 1 and "No space left on device" in err
    assert "before the disk fills" in log.read_text()
