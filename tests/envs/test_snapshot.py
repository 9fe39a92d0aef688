"""The copy of an environment instance that rewards receive (TRL's ``environments=``)."""

from __future__ import annotations

import pickle
import threading

from rlft.envs.snapshot import LostEnvironment, restore, snapshot


class Board:
    def __init__(self):
        self.moves = [3, 4]
        self.reward = 0.5
        self.lock = threading.Lock()  # cannot be pickled: a live client, a socket, a lock ...

    def score(self) -> float:
        return self.reward * len(self.moves)


def test_an_instance_with_an_unpicklable_attribute_is_copied_without_it():
    copy = restore(snapshot(Board()), "")
    assert isinstance(copy, Board) and copy.moves == [3, 4] and copy.reward == 0.5
    assert not hasattr(copy, "lock")
    assert copy.score() == 1.0  # its methods come along


def test_a_picklable_instance_is_copied_whole():
    board = Board()
    del board.lock
    assert vars(restore(snapshot(board), "")) == vars(board)


def test_a_lost_environment_answers_none_and_says_why():
    lost = restore(None, "its worker is gone")
    assert isinstance(lost, LostEnvironment) and not lost
    assert lost.reward is None and lost.anything is None
    assert repr(lost) == "<environment lost: its worker is gone>"
    unreadable = restore(pickle.dumps(1)[:-1], "")
    assert isinstance(unreadable, LostEnvironment) and "could not be read back" in repr(unreadable)
