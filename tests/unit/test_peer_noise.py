"""`HeldPeerNoise`: tfdist's lost-peer line comes before TensorFlow's C++ lines about it."""

import os

import pytest

from tfdist._internal import peer_noise

ABORT = (
    b"E0000 00:00:1796187376.728912    4825 base_collective_executor.cc:252] "
    b"BaseCollectiveExecutor::StartAbort UNAVAILABLE: Error reported from /job:worker/task:1\n"
    b"/job:worker/replica:0/task:1\n"
    b"The tasks have crashed. Check the task logs for an earlier error.\n"
    b"E0000 00:00:1796187376.728979    4825 ring_alg.cc:291] Aborting RingReduce with UNAVAILABLE\n"
)
OTHER = b"W0000 00:00:1796187376.7 4825 loader.cc:10] something else\n"
ERROR_LINE = "error: lost contact with another task of the job (...) (exit 200)\n"


def test_the_report_comes_before_the_held_collective_abort_lines(capfd):
    with peer_noise.HeldPeerNoise():
        os.write(2, b"Epoch 1/2\n" + ABORT + OTHER)
        peer_noise.write_first(ERROR_LINE)
    # Other lines go through at once; the held ones follow the report.
    assert capfd.readouterr().err.encode() == b"Epoch 1/2\n" + OTHER + ERROR_LINE.encode() + ABORT


def test_the_report_right_after_the_block_ended_with_the_error_still_comes_first(capfd):
    with pytest.raises(RuntimeError), peer_noise.HeldPeerNoise():
        os.write(2, ABORT)
        raise RuntimeError("the collective failed")
    peer_noise.write_first(ERROR_LINE)
    assert capfd.readouterr().err.encode() == ERROR_LINE.encode() + ABORT


def test_held_lines_without_a_report_are_written_when_the_block_ends(capfd):
    with peer_noise.HeldPeerNoise():
        os.write(2, ABORT + b"Epoch 2/2\n")
    assert capfd.readouterr().err.encode() == b"Epoch 2/2\n" + ABORT
