"""The transport profile reaches exactly the graph's image publishers, and the user's choice wins;
orphaned Fast DDS segments are removed, live ones never."""
from __future__ import annotations

import fcntl
import os
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import yaml

from dynnet_ros.graph_config import graph_processes, load_graph, parse_graph, separate_processes
from dynnet_ros.graph_transport import PROFILE_ENV, PROFILE_FILE, publishes_images, transport_env, use_image_profile
from dynnet_ros.supervisor.runner import GraphRunner
from dynnet_ros.supervisor.shm_orphans import MIN_AGE_S, owner_alive, remove_orphans

REPO = Path(__file__).resolve().parents[1]
NS = "{http://www.eprosima.com}"


def _processes(config: str, use_sim: bool = True):
    return {p.name: p for p in graph_processes(load_graph(REPO / "config" / config), use_sim)}


def test_the_vehicle_graph_gives_the_profile_to_the_simulator_and_the_container_only():
    processes = _processes("vehicle.yaml")
    given = {name for name, process in processes.items() if transport_env(process, {})}
    assert given == {"sensor_sim", "model_container"}
    profile = Path(transport_env(processes["sensor_sim"], {})[PROFILE_ENV])
    assert profile == REPO / "config" / PROFILE_FILE


def test_one_process_per_node_gives_it_to_the_image_publishers():
    data = separate_processes(yaml.safe_load((REPO / "config" / "vehicle.yaml").read_text()))  # the soak's layout
    processes = graph_processes(parse_graph(data))
    assert {p.name for p in processes if publishes_images(p)} == {"sensor_sim", "lane_node", "depth_node"}


def test_the_users_profile_wins():
    processes = _processes("vehicle.yaml")
    assert transport_env(processes["sensor_sim"], {PROFILE_ENV: "/etc/mine.xml"}) == {}
    environ = {PROFILE_ENV: "/etc/mine.xml"}
    use_image_profile(environ)
    assert environ == {PROFILE_ENV: "/etc/mine.xml"}
    empty: dict[str, str] = {}
    use_image_profile(empty)
    assert empty == {PROFILE_ENV: str(REPO / "config" / PROFILE_FILE)}


def test_the_profile_gives_a_segment_that_holds_large_frames_and_keeps_udp():
    root = ElementTree.parse(REPO / "config" / PROFILE_FILE).getroot()
    transports = {t.findtext(f"{NS}transport_id"): t for t in root.iter(f"{NS}transport_descriptor")}
    shm = next(t for t in transports.values() if t.findtext(f"{NS}type") == "SHM")
    assert int(shm.findtext(f"{NS}segment_size")) >= 2 * 1280 * 720 * 3   # two 1280x720 rgb8 frames
    participant = next(root.iter(f"{NS}participant"))
    assert participant.get("is_default_profile") == "true"
    used = [t.text for t in participant.iter(f"{NS}transport_id")]
    assert {transports[t].findtext(f"{NS}type") for t in used} == {"SHM", "UDPv4"}   # other hosts still reached


def _segment(directory: Path, name: str, size: int, age_s: float) -> Path:
    segment, lock = directory / name, directory / f"{name}_el"
    segment.write_bytes(b"\0" * size)
    lock.touch()
    old = os.path.getmtime(lock) - age_s
    os.utime(lock, (old, old))
    return lock


def test_orphaned_segments_are_removed_and_live_or_young_ones_kept(tmp_path):
    orphan = _segment(tmp_path, "fastdds_0123456789abcdef", 4096, MIN_AGE_S + 5)
    live = _segment(tmp_path, "fastdds_fedcba9876543210", 2048, MIN_AGE_S + 5)
    young = _segment(tmp_path, "fastdds_00000000000000aa", 1024, 0.0)
    other = tmp_path / "fastdds_port7411"   # ports are left to Fast DDS
    other.write_bytes(b"p")
    held = os.open(live, os.O_RDONLY)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)     # its owner is alive: it holds the lock
        assert owner_alive(live) and not owner_alive(orphan)
        removed = remove_orphans(tmp_path)
    finally:
        os.close(held)
    assert sorted(removed) == sorted([(tmp_path / "fastdds_0123456789abcdef", 4096), (orphan, 0)])
    assert not orphan.exists() and not (tmp_path / "fastdds_0123456789abcdef").exists()
    assert live.exists() and (tmp_path / "fastdds_fedcba9876543210").exists()
    assert young.exists() and other.exists()
    assert remove_orphans(tmp_path / "missing") == []


def test_the_supervisor_starts_image_publishers_with_the_profile_and_the_rest_without():
    seen: list[tuple[str, str]] = []
    separate = parse_graph(separate_processes(yaml.safe_load((REPO / "config" / "vehicle.yaml").read_text())))
    runner = GraphRunner(separate, sink=lambda name, line: seen.append((name, line)),
                         env={k: v for k, v in os.environ.items() if k != PROFILE_ENV})
    probe = [sys.executable, "-c", f"import os; print(os.environ.get({PROFILE_ENV!r}, 'none'))"]
    try:
        for process in runner.nodes:
            proc, reader = runner._spawn(process, probe)
            proc.wait(timeout=60)
            reader.join(timeout=10)
    finally:
        runner._tmp.cleanup()
    profile = str(REPO / "config" / PROFILE_FILE)
    assert dict(seen) == {"sensor_sim": profile, "lane_node": profile, "depth_node": profile,
                          "pedestrian_node": "none", "budget_manager": "none"}
