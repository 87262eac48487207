"""Memory sources on fixture files: meminfo, Jetson NvMap, cgroup v2/v1 discovery and limits."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from dynnet_ros.budget.cgroup import CgroupPaths, find_cgroup, locate_cgroup, parse_limit_bytes
from dynnet_ros.budget.sources import (
    MemoryReading,
    MemorySource,
    choose,
    parse_meminfo,
    reading_from_cgroup,
    reading_from_jetson_meminfo,
    reading_from_meminfo,
)
from dynnet_ros.bytesize import MB
from dynnet_ros.procmem import parse_proc_status, process_memory, process_rss, status_bytes

MEMINFO = """MemTotal:        8000000 kB
MemFree:         1000000 kB
MemAvailable:    2500000 kB
Buffers:          100000 kB
Cached:          1500000 kB
SwapFree:              0 kB
SReclaimable:     200000 kB
Shmem:             50000 kB
HugePages_Total:       0
"""
# A Jetson (unified memory): 2 GB of GPU allocations in NvMap
JETSON = MEMINFO + "NvMapMemFree:      94784 kB\nNvMapMemUsed:    2048000 kB\n"

MOUNTINFO_V2 = """22 1 0:21 / / rw - overlay overlay rw
30 22 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
"""
MOUNTINFO_V1 = """31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_parse_meminfo_units_and_reading():
    info = parse_meminfo(MEMINFO)
    assert info["MemTotal"] == 8000000 * 1024 and info["HugePages_Total"] == 0
    r = reading_from_meminfo(info)
    assert r.total_mb == pytest.approx(8000000 / 1024) and r.available_mb == pytest.approx(2500000 / 1024)
    # pre-3.14 kernels have no MemAvailable: free + buffers + cache + reclaimable slab - shmem
    old = reading_from_meminfo(parse_meminfo(MEMINFO.replace("MemAvailable:    2500000 kB\n", "")))
    assert old.available_mb == pytest.approx((1000000 + 100000 + 1500000 + 200000 - 50000) / 1024)
    with pytest.raises(ValueError, match="MemTotal"):
        reading_from_meminfo({})


def test_jetson_reading_reports_nvmap_and_bounds_available():
    r = reading_from_jetson_meminfo(parse_meminfo(JETSON))
    assert r.source == "jetson" and r.gpu_shared_mb == pytest.approx(2048000 / 1024)
    assert r.available_mb == pytest.approx(2500000 / 1024)
    # little reclaimable memory left besides GPU allocations: the CUDA-for-Tegra bound binds
    tight = JETSON.replace("MemFree:         1000000 kB", "MemFree:          100000 kB") \
                  .replace("Cached:          1500000 kB", "Cached:           100000 kB")
    r = reading_from_jetson_meminfo(parse_meminfo(tight))
    assert r.available_mb == pytest.approx((100000 + 100000 + 100000 + 200000) / 1024)
    assert r.available_mb < 2500000 / 1024


def test_cgroup_limits_parse_and_headroom():
    assert parse_limit_bytes("max\n") is None
    assert parse_limit_bytes("9223372036854771712") is None  # v1 "unlimited"
    assert parse_limit_bytes("1073741824") == 1 << 30
    with pytest.raises(ValueError, match="limit"):
        parse_limit_bytes("lots")
    assert reading_from_cgroup(2, "max", "123") is None
    r = reading_from_cgroup(2, str(2048 * MB), str(1536 * MB), f"anon 1\ninactive_file {128 * MB}\n")
    assert r.source == "cgroup-v2" and r.total_mb == 2048 and r.available_mb == pytest.approx(640)
    r1 = reading_from_cgroup(1, str(1024 * MB), str(1000 * MB), f"total_inactive_file {24 * MB}\n")
    assert r1.source == "cgroup-v1" and r1.available_mb == pytest.approx(48)


def test_find_cgroup_v2_and_v1_and_container_root(tmp_path):
    _write(tmp_path, "sys/fs/cgroup/user.slice/app/memory.max", str(512 * MB))
    _write(tmp_path, "sys/fs/cgroup/user.slice/app/memory.current", str(100 * MB))
    found = find_cgroup("0::/user.slice/app\n", MOUNTINFO_V2, tmp_path)
    assert found.version == 2 and found.directory == tmp_path / "sys/fs/cgroup/user.slice/app"
    # v1 hierarchy; the listed path does not exist inside the container, so the mount root is used
    _write(tmp_path, "sys/fs/cgroup/memory/memory.limit_in_bytes", str(256 * MB))
    _write(tmp_path, "sys/fs/cgroup/memory/memory.usage_in_bytes", str(10 * MB))
    found = find_cgroup("4:memory:/process_api/abc\n0::/\n", MOUNTINFO_V1, tmp_path)
    assert found.version == 1 and found.directory == tmp_path / "sys/fs/cgroup/memory"
    assert find_cgroup("0::/\n", "", tmp_path) is None


def test_cgroup_read_on_a_fixture_tree(tmp_path):
    _write(tmp_path, "proc/self/cgroup", "0::/robot\n")
    _write(tmp_path, "proc/self/mountinfo", MOUNTINFO_V2)
    _write(tmp_path, "sys/fs/cgroup/robot/memory.max", str(512 * MB))
    _write(tmp_path, "sys/fs/cgroup/robot/memory.current", str(100 * MB))
    found = locate_cgroup(tmp_path)
    assert found == CgroupPaths(2, tmp_path / "sys/fs/cgroup/robot")
    usage = found.read()
    assert (usage.limit, usage.usage, usage.stat_text) == (512 * MB, 100 * MB, "")
    _write(tmp_path, "sys/fs/cgroup/robot/memory.current", "lots\n")
    with pytest.raises(ValueError, match="usage"):
        found.read()
    assert locate_cgroup(tmp_path / "nowhere") is None


def test_choose_picks_the_binding_reading():
    sys_r = MemoryReading("meminfo", 8000, 3000)
    cg = MemoryReading("cgroup-v2", 2048, 640)
    best = choose([sys_r, cg])
    assert best.source == "cgroup-v2" and best.available_mb == 640
    assert best.details["candidates"] == {"meminfo": 3000, "cgroup-v2": 640}
    with pytest.raises(ValueError):
        choose([])


def test_memory_source_on_fixture_tree(tmp_path):
    _write(tmp_path, "proc/meminfo", JETSON)
    _write(tmp_path, "proc/self/cgroup", "0::/robot\n")
    _write(tmp_path, "proc/self/mountinfo", MOUNTINFO_V2)
    _write(tmp_path, "sys/fs/cgroup/robot/memory.max", str(1024 * MB))
    _write(tmp_path, "sys/fs/cgroup/robot/memory.current", str(900 * MB))
    _write(tmp_path, "sys/fs/cgroup/robot/memory.stat", f"inactive_file {20 * MB}\n")
    src = MemorySource(tmp_path)
    assert [r.source for r in src.readings()] == ["jetson", "cgroup-v2"]
    reading = src.read()
    assert reading.source == "cgroup-v2" and reading.available_mb == pytest.approx(144)
    assert reading.gpu_shared_mb == pytest.approx(2000)  # NvMap carried over from the Jetson view
    # the group's limit is lifted: the system view binds again
    _write(tmp_path, "sys/fs/cgroup/robot/memory.max", "max\n")
    assert MemorySource(tmp_path).read().source == "jetson"


def test_memory_source_on_this_machine():
    reading = MemorySource().read()
    assert 0 < reading.available_mb <= reading.total_mb
    assert reading.source in {"psutil", "jetson", "cgroup-v1", "cgroup-v2"}


def test_process_memory_separates_anonymous_pages():
    status = ("Name:\tpython\nVmRSS:\t  262144 kB\nRssAnon:\t  196608 kB\nRssFile:\t   64512 kB\n"
              "RssShmem:\t    1024 kB\n")
    mem = parse_proc_status(status)
    assert mem.rss_mb == 256 and mem.anon_mb == 193  # file pages are reclaimable: not "held"
    with pytest.raises(ValueError, match="VmRSS"):
        parse_proc_status("Name: x\n")
    here = process_memory()
    assert 0 < here.anon_mb <= here.rss_mb


def test_one_rss_reader_for_every_caller():
    rss = process_rss([os.getpid(), 2**22 + 12345])  # the second pid does not exist
    assert list(rss) == [os.getpid()] and rss[os.getpid()] % 1024 == 0
    assert status_bytes("VmHWM") >= status_bytes("VmRSS") > 0
    with pytest.raises(KeyError):
        status_bytes("NoSuchLine")
