"""The episodes' fork server: a later run whose environment needs other modules gets a server that
preloads them, unless a worker of the running one is still alive."""

from __future__ import annotations

from multiprocessing import forkserver

from rlft.envs import worker as w
from rlft.envs.spec import EnvironmentSpec


def test_a_second_environment_gets_a_fork_server_preloading_its_modules_once_the_first_has_no_worker():
    calculator = EnvironmentSpec.load("calculator", [], {})
    guess = EnvironmentSpec.load("guess_number", [], {})
    assert not set(guess.modules) <= set(calculator.modules)
    w._stop_fork_server()  # whatever an earlier test in this process started
    w._PRELOADED.clear()
    first = w.ProcessWorker(calculator)
    server = forkserver._forkserver
    started = server._forkserver_pid
    assert set(calculator.modules) <= set(server._preload_modules)
    beside = w.ProcessWorker(guess)  # the first's worker still runs: its server stays, this child imports
    assert server._forkserver_pid == started
    for worker in (first, beside):
        worker.send("reset", {"question": "2 + 3", "answer": "5"} if worker is first else {"secret": 3}, 0)
        assert worker.receive(60).ok
        worker.close()
    later = w.ProcessWorker(guess)
    assert server._forkserver_pid != started
    assert set(calculator.modules) | set(guess.modules) <= set(server._preload_modules)
    later.send("reset", {"secret": 3}, 0)
    assert later.receive(60).ok
    later.close()
