"""WeightWindow (swap/residency.py): every segment finds its weights in place, bytes stay within
the allowance, and the stream never stalls for good, whatever the read timing."""
from __future__ import annotations

import contextlib
import random
import threading
import time

import numpy as np
import pytest

from dynnet_ros.swap.residency import WeightWindow
from dynnet_ros.swap.swapin import ALIGN, HostArena, WeightReader, align_up


class SlowReader:
    """A real WeightReader whose reads take a random few milliseconds (a busy disk)."""

    def __init__(self, path, rng: random.Random) -> None:
        self.inner = WeightReader(path)
        self.rng = rng
        self.mode = self.inner.mode

    def read_into(self, view, offset):
        time.sleep(self.rng.random() * 0.003)
        return self.inner.read_into(view, offset)

    def close(self):
        self.inner.close()


def make_model(tmp_path, rng: random.Random, segments: int = 12):
    """A weight file of random tensors and, per segment, the tensors it reads (some shared)."""
    sizes = [rng.choice([3000, 9000, 40000, 130000]) for _ in range(segments + 4)]
    offsets, offset = [], 0
    for size in sizes:
        offsets.append(offset)
        offset = align_up(offset + size, ALIGN)
    data = np.frombuffer(rng.randbytes(offset), dtype=np.uint8)
    path = tmp_path / "weights.bin"
    path.write_bytes(data.tobytes())
    tensors = {f"w{i}": (offsets[i], align_up(size, ALIGN), offsets[i]) for i, size in enumerate(sizes)}
    names = list(tensors)
    per_segment = [[] for _ in range(segments)]
    for i, name in enumerate(names):
        first = min(i, segments - 1) if i < segments else rng.randrange(segments)
        per_segment[first].append(name)
        if rng.random() < 0.2:  # read again later (a weight live across segments)
            per_segment[rng.randrange(first, segments)].append(name)
    return path, data, tensors, [sorted(set(s)) for s in per_segment]


@pytest.mark.parametrize("seed", range(6))
def test_segments_find_their_weights_within_the_allowance(tmp_path, seed):
    rng = random.Random(seed)
    path, data, tensors, per_segment = make_model(tmp_path, rng)
    region = HostArena(len(data))
    reader = SlowReader(path, rng)
    window = WeightWindow(region, reader, tensors, per_segment)
    total = window.total_span
    allowances = [window.min_stream_bytes, window.min_stream_bytes + total // 3, total, window.min_stream_bytes]
    done = threading.Event()

    def frames():
        for frame in range(24):
            if frame % 6 == 0:
                window.set_allowance(allowances[frame // 6])
            window.frame_start()
            for k, names in enumerate(per_segment):
                window.before(k)
                assert window.resident_bytes <= window.allowance
                for name in names:
                    offset, span, _ = tensors[name]
                    size = min(span, len(data) - offset)
                    assert np.array_equal(region.array[offset:offset + size], data[offset:offset + size]), name
                time.sleep(rng.random() * 0.001)
                window.after(k)
            window.frame_end()
        done.set()

    worker = threading.Thread(target=frames, daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert done.is_set(), "the stream stalled"
    assert window.stats.peak_resident <= max(allowances)
    window.set_allowance(window.min_stream_bytes)
    assert window.resident_bytes <= window.min_stream_bytes
    window.close()
    reader.close()
    region.close()


@contextlib.contextmanager
def opened_window(tmp_path, seed: int, reader_hook=None):
    """A window over a random model with a real reader; closes all three afterwards."""
    path, data, tensors, per_segment = make_model(tmp_path, random.Random(seed))
    region = HostArena(len(data))
    reader = WeightReader(path)
    if reader_hook is not None:
        reader.read_into = reader_hook(reader.read_into)
    window = WeightWindow(region, reader, tensors, per_segment)
    try:
        yield window, per_segment
    finally:
        window.close()
        reader.close()
        region.close()


def test_allowance_below_one_segment_is_refused(tmp_path):
    with opened_window(tmp_path, 7) as (window, _), pytest.raises(ValueError, match="below"):
        window.set_allowance(window.min_stream_bytes - ALIGN)


def test_failed_read_reaches_the_run_and_the_next_frame_recovers(tmp_path):
    calls = {"n": 0}

    def flaky(real):
        def read_into(view, offset):
            calls["n"] += 1
            if calls["n"] == 2:
                raise OSError(5, "I/O error")
            return real(view, offset)
        return read_into

    with opened_window(tmp_path, 8, flaky) as (window, per_segment):
        window.frame_start()
        with pytest.raises(ValueError, match="swapping weights in failed"):
            for k in range(len(per_segment)):
                window.before(k)
                window.after(k)
        window.abort()
        window.frame_start()
        for k in range(len(per_segment)):
            window.before(k)
            window.after(k)
        window.frame_end()
