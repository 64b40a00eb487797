"""The caching allocator's recorded history turned into an outcore trace
(``outcore.torch.allochistory``), on hand-written snapshots: the recording
itself needs CUDA, the conversion does not."""

from __future__ import annotations

import pytest

from outcore.torch.allochistory import MARKER_BYTES, history_files, trace_to_oom

MIB = 1 << 20


def _before():
    """One 2 MiB segment at 4096: a live 1 KiB block, then a cached free one."""
    return [{"address": 4096, "total_size": 2 * MIB,
             "blocks": [{"size": 1024, "state": "active_allocated"},
                        {"size": 2 * MIB - 1024, "state": "inactive"}]}]


def test_a_history_becomes_a_trace_with_the_live_blocks_first_and_frees_when_completed():
    trace = [
        {"action": "segment_alloc", "addr": 1 << 30, "size": 20 * MIB},
        {"action": "alloc", "addr": 1 << 30, "size": 4 * MIB},
        {"action": "alloc", "addr": (1 << 30) + 4 * MIB, "size": 3 * MIB},
        # requested on a copy stream: reusable only once completed
        {"action": "free_requested", "addr": 1 << 30, "size": 4 * MIB},
        {"action": "free_completed", "addr": 4096, "size": 1024},  # the block live before recording
        {"action": "free_completed", "addr": 1 << 30, "size": 4 * MIB},
        {"action": "alloc", "addr": 1 << 30, "size": 2 * MIB},  # the address again: a new block
        {"action": "oom", "size": 1 << 40, "device_free": 5},
        {"action": "segment_free", "addr": 1 << 31, "size": 20 * MIB},
    ]
    doc, summary = history_files(_before(), trace, 100 * MIB)
    assert doc["format"] == "outcore-alloc-trace/1"
    assert doc["capacity_bytes"] == 100 * MIB
    assert doc["events"] == [
        {"op": "alloc", "id": 0, "size_bytes": 1024},
        {"op": "alloc", "id": 1, "size_bytes": 4 * MIB},
        {"op": "alloc", "id": 2, "size_bytes": 3 * MIB},
        {"op": "free", "id": 0},
        {"op": "free", "id": 1},
        {"op": "alloc", "id": 3, "size_bytes": 2 * MIB},
    ]
    assert summary["initial_reserved_bytes"] == 2 * MIB
    assert summary["initial_live_blocks"] == 1
    # 2 MiB before, 22 after the segment, 2 after its release
    assert summary["peak_reserved_bytes"] == 22 * MIB
    assert [s["reserved"] for s in summary["segments"]] == [22 * MIB, 2 * MIB]
    assert summary["ooms"] == [{"event": 6, "size": 1 << 40, "device_free": 5}]
    assert summary["frees_of_unknown_blocks"] == 0
    assert summary["op_starts"] == []


def test_op_marks_are_left_out_of_the_trace_only_when_the_run_marked_its_ops():
    trace = [
        {"action": "alloc", "addr": 9000, "size": MARKER_BYTES},
        {"action": "free_completed", "addr": 9000, "size": MARKER_BYTES},
        {"action": "alloc", "addr": 1 << 30, "size": 4 * MIB},
        {"action": "alloc", "addr": 9000, "size": MARKER_BYTES},
        {"action": "free_completed", "addr": 9000, "size": MARKER_BYTES},
        {"action": "free_completed", "addr": 12345, "size": 512},  # never allocated: counted
    ]
    doc, summary = history_files([], trace, 100 * MIB, ops=[7, 9])
    assert doc["events"] == [{"op": "alloc", "id": 0, "size_bytes": 4 * MIB}]
    assert summary["op_starts"] == [{"op": 7, "event": 0}, {"op": 9, "event": 1}]
    assert summary["frees_of_unknown_blocks"] == 1
    # without marks, a block of the marker's size is an ordinary tensor
    doc, summary = history_files([], trace, 100 * MIB)
    assert len(doc["events"]) == 5 and summary["op_starts"] == []


def test_the_trace_to_an_out_of_memory_ends_in_the_refused_request():
    trace = [
        {"action": "alloc", "addr": 1 << 30, "size": 4 * MIB},
        {"action": "alloc", "addr": 2 << 30, "size": 8 * MIB},
        {"action": "free_completed", "addr": 1 << 30, "size": 4 * MIB},
        {"action": "oom", "size": 64 * MIB, "device_free": 5},
        {"action": "free_completed", "addr": 2 << 30, "size": 8 * MIB},  # the recovery after it
    ]
    doc, summary = history_files([], trace, 32 * MIB)
    cut = trace_to_oom(doc, summary)
    assert cut["capacity_bytes"] == 32 * MIB
    assert cut["events"] == [
        {"op": "alloc", "id": 0, "size_bytes": 4 * MIB},
        {"op": "alloc", "id": 1, "size_bytes": 8 * MIB},
        {"op": "free", "id": 0},
        {"op": "alloc", "id": 2, "size_bytes": 64 * MIB},
    ]
    with pytest.raises(ValueError, match="the history has 1"):
        trace_to_oom(doc, summary, 1)
