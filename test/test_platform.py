"""Platform paths: what hostcaps.py detects, and the non-x86 branches forced on this machine.

ARM CPUs (Jetson) have no onnxruntime NCHWc kernels, some arm64 kernels have 64 KiB base pages
and 512 MiB huge pages. ``hostcaps.override`` makes this x86 machine report such a host for one
``with`` block, so the fallbacks run for real here: the engine plans the model as given, the
weight arena's slots and page drops follow the larger page, huge pages are left alone.
"""
from __future__ import annotations

import onnxruntime as ort
import pytest
from _swap_models import check_equal

from dynnet_ros import hostcaps
from dynnet_ros.commands.swap_bench_worker import make_feeds
from dynnet_ros.engine import Engine
from dynnet_ros.engine.modelio.loader import load_skeleton
from dynnet_ros.engine.plan.layout import cpu_block_size, laid_out_skeleton
from dynnet_ros.swap.swapin import HostArena, arena_layout, huge_pages_available, page_unit
from dynnet_ros.zoo import ensure_model

pytestmark = pytest.mark.subset
ARM64_64K = {"machine": "aarch64", "nchwc_block": None, "page_size": 64 * 1024, "huge_page": None}
X86_FLAGS = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n"


@pytest.fixture(autouse=True)
def isolated(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("DYNNET_SWAP_DIR", str(tmp_path_factory.getbasetemp() / "swap-stores"))


@pytest.mark.parametrize("machine, cpuinfo, block", [
    ("x86_64", X86_FLAGS, 8),
    ("x86_64", X86_FLAGS.replace("avx2", "avx2 avx512f"), 16),
    ("x86_64", "flags\t\t: fpu sse2 sse4_2\n", None),              # x86 without AVX: MLAS has no NCHWc there
    ("aarch64", "processor\t: 0\nFeatures\t: fp asimd evtstrm aes crc32\n", None),
    ("aarch64", X86_FLAGS, None),                                   # the machine decides, not a stray flag
])
def test_nchwc_block_follows_the_cpu(machine, cpuinfo, block):
    assert hostcaps.nchwc_block_size(machine, cpuinfo) == block


@pytest.mark.parametrize("enabled, pmd, size", [
    ("always [madvise] never", "2097152", 2 * 2**20),
    ("[always] madvise never", "2097152", 2 * 2**20),
    ("always madvise [never]", "2097152", None),
    ("always [madvise] never", "536870912", None),   # arm64 with 64 KiB pages: 512 MiB huge pages
    ("always [madvise] never", None, 2 * 2**20),     # kernel without hpage_pmd_size
    ("", None, None),                                # no THP at all
])
def test_huge_pages_only_where_the_kernel_offers_small_ones(enabled, pmd, size):
    assert hostcaps.usable_huge_page(enabled, pmd) == size


def test_override_applies_inside_the_block_only():
    real = hostcaps.host_caps()
    assert real == hostcaps.detect()
    with hostcaps.override(**ARM64_64K) as caps:
        assert hostcaps.host_caps() is caps and not caps.x86
        assert cpu_block_size() is None and page_unit() == 64 * 1024 and not huge_pages_available()
    assert hostcaps.host_caps() == real


def test_without_nchwc_kernels_the_engine_plans_the_model_as_given():
    path = str(ensure_model("pedestrian"))
    reference = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [o.name for o in reference.get_outputs()]
    with hostcaps.override(**ARM64_64K):
        with pytest.raises(ValueError, match="no onnxruntime NCHWc kernels"):
            laid_out_skeleton(load_skeleton(path))
        engine = Engine(path, threads=1)
    try:
        assert engine.stats()["plan"]["layout"] == "as-given"
        for height, width in ((96, 128), (160, 96)):
            feeds = make_feeds(engine.inputs, height, width, seed=3)
            check_equal(engine.run(feeds), reference.run(names, feeds), names)
    finally:
        engine.close()


def test_arena_slots_and_page_drops_follow_a_64k_page():
    spans = [4096, 70_000, 12_288]
    with hostcaps.override(**ARM64_64K):
        offsets, size = arena_layout(spans, huge_pages=False)
        assert all(offset % (64 * 1024) == 0 for offset in offsets) and size % (64 * 1024) == 0
        arena = HostArena(size)
        try:
            assert arena.array is not None
            arena.array[:] = 7
            arena.release(offsets[1], spans[1])          # 70,000 bytes: two whole 64 KiB pages dropped
            assert not arena.array[offsets[1]:offsets[1] + 2 * 64 * 1024].any()
            assert (arena.array[offsets[0]:offsets[0] + spans[0]] == 7).all()
            assert (arena.array[offsets[2]:offsets[2] + spans[2]] == 7).all()
        finally:
            arena.close()


@pytest.mark.slow
def test_a_64k_page_host_streams_the_model_as_given_within_its_budget():
    path = str(ensure_model("lane"))
    reference = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [o.name for o in reference.get_outputs()]
    with hostcaps.override(**ARM64_64K):
        engine = Engine(path, threads=1, swappable=True)
        try:
            feeds = make_feeds(engine.inputs, 96, 128, seed=1)
            want = reference.run(names, feeds)
            check_equal(engine.run(feeds), want, names)
            window = engine.engine_stats().window
            assert window is not None and window.layout == "as-given"
            streamed = engine._executor
            assert not streamed.region.huge_pages and streamed.region.page == 64 * 1024
            assert all(place % (64 * 1024) == 0 for place in streamed.places.values())
            engine.set_memory_budget(engine.min_budget_mb() * 1.001)
            for _ in range(2):
                check_equal(engine.run(feeds), want, names)
            stats = engine.stats()["swap"]
            assert stats["last_frame_read_mb"] > 0 and stats["resident_weight_bytes"] <= stats["allowance_bytes"]
        finally:
            engine.close()

