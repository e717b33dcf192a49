"""A run folder is written by one launch at a time, never beside a rank an earlier launch left alive."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

from training.finetune.runlock import exclusive_launch

RANK = (
    "import sys, time; from pathlib import Path; from training.finetune.runlock import hold_as_rank\n"
    "hold_as_rank(Path(sys.argv[1])); print('holding', flush=True); time.sleep(600)\n"
)


def test_a_launch_waits_for_a_leftover_rank_and_goes_on_once_it_is_killed(tmp_path: Path) -> None:
    rank = subprocess.Popen([sys.executable, "-c", RANK, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert rank.stdout is not None and rank.stdout.readline().strip() == "holding"
        entered = threading.Event()

        def launch() -> None:
            with exclusive_launch(tmp_path):
                entered.set()

        t = threading.Thread(target=launch, daemon=True)
        t.start()
        assert not entered.wait(1.0)  # the leftover rank still holds the folder
        rank.send_signal(signal.SIGKILL)  # kill -9: the kernel releases its lock
        rank.wait()
        assert entered.wait(60)
        t.join(60)
    finally:
        if rank.poll() is None:
            rank.kill()


def test_launches_of_one_folder_take_turns(tmp_path: Path) -> None:
    order: list[str] = []
    inside = threading.Event()
    release = threading.Event()

    def first() -> None:
        with exclusive_launch(tmp_path):
            order.append("first in")
            inside.set()
            release.wait(60)
            order.append("first out")

    def second() -> None:
        with exclusive_launch(tmp_path):
            order.append("second in")

    a = threading.Thread(target=first, daemon=True)
    a.start()
    assert inside.wait(60)
    b = threading.Thread(target=second, daemon=True)
    b.start()
    b.join(0.5)
    assert order == ["first in"]  # the second launch waits
    release.set()
    a.join(60)
    b.join(60)
    assert order == ["first in", "first out", "second in"]
