"""The README's robot install, checked with rosdep itself, offline, against rosdistro's database.

`rosdep install --from-paths src --ignore-src` stops at the first key it cannot resolve, before
colcon runs, so every key of package.xml must resolve on each distribution's platforms. The
rosdistro snapshot in ../shared (rosdep's base.yaml and python.yaml, the Humble, Jazzy and Kilted
distribution files) stands in for the network: rosdep reads it through a local sources list and a
local rosdistro index, together with the repository's own rosdep/dynnet_ros.yaml, the way a robot
reads it after the README's `sources.list.d` line. `rosdep keys` and `rosdep resolve` are the
steps of `rosdep install` before it calls apt and pip; those run on the host, so they are not
simulated here.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from catkin_pkg.package import parse_package

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOT = ROOT.parent / "shared" / "bench-data" / "rosdistro"
OUR_RULES = ROOT / "rosdep" / "dynnet_ros.yaml"
#: rosdistro's keys named after a PyPI project (no python3- prefix, no -pip suffix) that package.xml uses
PIP_PROJECT_KEYS = {"mcap-ros2-support"}
# Each distribution's release_platforms (distribution.yaml) of the Debian family; the pip rules
# this package needs exist for ubuntu and debian only, so RHEL is not a supported platform.
PLATFORMS = {
    "humble": ("ubuntu:jammy",),
    "jazzy": ("ubuntu:noble", "debian:bookworm"),
    "kilted": ("ubuntu:noble", "debian:bookworm"),
}
CASES = [(distro, platform) for distro, platforms in PLATFORMS.items() for platform in platforms]
# rosdep's YAML sources and rosdistro's distribution files dominate a run through PyYAML's
# pure-Python loader; libyaml's loader (the same YAML safe subset) builds byte-identical caches
# several times faster.
RUN_ROSDEP = ("import functools, sys, yaml\n"
              "loader = getattr(yaml, 'CSafeLoader', yaml.SafeLoader)\n"
              "yaml.safe_load = functools.partial(yaml.load, Loader=loader)\n"
              "from rosdep2.main import rosdep_main\n"
              "rosdep_main(sys.argv[1:])\n")
# A proxy on a closed local port: any http(s) request rosdep might make fails at once instead of
# reaching the network, so a passing run proves the file:// sources were enough.
NO_NETWORK = {"http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9",
              "HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9",
              "no_proxy": "", "NO_PROXY": ""}

pytestmark = [
    pytest.mark.skipif(not SNAPSHOT.is_dir(),
                       reason=f"the rosdistro snapshot {SNAPSHOT} is absent (../shared beside the repository)"),
    pytest.mark.graph,
]


@dataclass(frozen=True)
class Resolution:
    """What one rosdep key becomes on one platform: the installer and its package names."""

    installer: str
    packages: tuple[str, ...]


@dataclass(frozen=True)
class Rosdep:
    """rosdep run as a robot would run it, with its sources, index and cache in a temp dir."""

    env: dict[str, str]
    workspace: Path

    def run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", RUN_ROSDEP, *args], env=self.env, capture_output=True,
                              text=True, timeout=300)

    def resolve(self, keys: list[str], distro: str, platform: str) -> dict[str, Resolution]:
        result = self.run("resolve", *keys, f"--os={platform}", f"--rosdistro={distro}")
        assert result.returncode == 0, result.stdout + result.stderr
        return parse_resolve(result.stdout)


def parse_resolve(text: str) -> dict[str, Resolution]:
    """`rosdep resolve` prints `#ROSDEP[key]`, `#installer`, then the packages, per key."""
    found: dict[str, Resolution] = {}
    blocks = re.findall(r"^#ROSDEP\[(.+?)\]\n#(\w+)\n(.*)$", text, flags=re.MULTILINE)
    for key, installer, packages in blocks:
        found[key] = Resolution(installer, tuple(packages.split()))
    return found


def package_keys(path: Path) -> list[str]:
    """Every rosdep key package.xml declares (exec, build, test, ...), as `rosdep install` reads them."""
    package = parse_package(str(path))
    depends = (package.build_depends + package.buildtool_depends + package.build_export_depends
               + package.buildtool_export_depends + package.exec_depends + package.test_depends
               + package.doc_depends)
    return sorted({d.name for d in depends})


def pinned_distributions(requirements: str = "requirements.txt") -> set[str]:
    names = set()
    for line in (ROOT / requirements).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            names.add(re.split(r"[=<>~!\[; ]", line)[0].lower().replace("_", "-"))
    return names


def _index(tmp: Path) -> Path:
    """A REP 153 rosdistro index naming the snapshot's distribution files by file:// URL."""
    distributions = {distro: {"distribution": [(SNAPSHOT / distro / "distribution.yaml").as_uri()],
                              "distribution_status": "active", "distribution_type": "ros2", "python_version": 3}
                     for distro in PLATFORMS}
    path = tmp / "index-v4.yaml"
    path.write_text(yaml.safe_dump({"type": "index", "version": 4, "distributions": distributions}))
    return path


@pytest.fixture(scope="module")
def rosdep(tmp_path_factory) -> Rosdep:
    assert importlib.util.find_spec("rosdep2"), "rosdep is a dev dependency (requirements-dev.txt); run `make venv`"
    tmp = tmp_path_factory.mktemp("rosdep")
    sources = tmp / "sources.list.d"
    sources.mkdir()
    # The robot's order: the default list (20-default.list) before ours, so upstream keys win.
    (sources / "20-default.list").write_text("".join(
        f"yaml {(SNAPSHOT / 'rosdep' / name).as_uri()}\n" for name in ("base.yaml", "python.yaml")))
    (sources / "50-dynnet_ros.list").write_text(f"yaml {OUR_RULES.as_uri()}\n")
    # A robot's workspace before `rosdep install`: no ROS settings, and no install space whose packages
    # `--ignore-src` would take as already built (make test sources the interface kit's)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ROS", "PIP_")) and k not in ("AMENT_PREFIX_PATH", "CMAKE_PREFIX_PATH")}
    env.update(NO_NETWORK, ROSDEP_SOURCE_PATH=str(sources), ROS_HOME=str(tmp / "ros_home"),
               ROSDISTRO_INDEX_URL=_index(tmp).as_uri())
    workspace = tmp / "ws" / "src"
    (workspace / "dynnet_ros").mkdir(parents=True)
    (workspace / "dynnet_ros" / "package.xml").write_text((ROOT / "package.xml").read_text())
    runner = Rosdep(env, workspace)
    result = runner.run("update")
    assert result.returncode == 0, result.stdout + result.stderr
    for distro in PLATFORMS:
        assert f'Add distro "{distro}"' in result.stdout, result.stdout
    return runner


def test_platforms_are_the_snapshots_release_platforms():
    for distro, platforms in PLATFORMS.items():
        text = (SNAPSHOT / distro / "distribution.yaml").read_text()
        head = yaml.safe_load(text[:text.index("\nrepositories:")])
        released = {f"{os_name}:{codename}" for os_name in ("ubuntu", "debian")
                    for codename in head["release_platforms"].get(os_name, [])}
        assert set(platforms) == released, distro


@pytest.mark.parametrize("distro,platform", CASES)
def test_every_package_xml_key_resolves(rosdep, distro, platform):
    keys = package_keys(ROOT / "package.xml")
    resolved = rosdep.resolve(keys, distro, platform)
    assert sorted(resolved) == keys
    pinned = pinned_distributions()
    for key, rule in resolved.items():
        assert rule.packages, f"{key} resolves to no package on {platform}"
        if key in PIP_PROJECT_KEYS:  # rosdistro's pip rule for a test tool, pinned with the test tools
            assert rule == Resolution("pip", (key,)), (key, rule)
            assert key in pinned_distributions("requirements-dev.txt"), key
        elif not key.startswith("python3-"):  # a ROS package: the distribution's binary
            assert rule == Resolution("apt", (f"ros-{distro}-{key.replace('_', '-')}",)), (key, rule)
        elif key.endswith("-pip"):  # rosdistro's naming rule for keys that install from PyPI
            assert rule.installer == "pip", (key, rule)
            unpinned = {p for p in rule.packages if p.lower() not in pinned}
            assert not unpinned, f"{key} installs {unpinned} from PyPI, which requirements.txt does not pin"
        else:
            assert rule.installer == "apt" and all(p.startswith("python3-") for p in rule.packages), (key, rule)


def test_rosdep_reads_the_keys_package_xml_declares(rosdep):
    """`rosdep keys --from-paths src --ignore-src`: what `rosdep install` collects before resolving."""
    result = rosdep.run("keys", "--from-paths", str(rosdep.workspace), "--ignore-src", "--rosdistro=jazzy")
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(result.stdout.split()) == package_keys(ROOT / "package.xml")


def test_an_unknown_key_stops_the_install(rosdep, tmp_path):
    """What the resolve checks guard against: `rosdep install` gives up on one key it cannot locate."""
    src = tmp_path / "src" / "dynnet_ros"
    src.mkdir(parents=True)
    xml = (ROOT / "package.xml").read_text()
    src.joinpath("package.xml").write_text(
        xml.replace("<test_depend>", "<exec_depend>python3-dynnet-no-such-key-pip</exec_depend>\n  <test_depend>", 1))
    result = rosdep.run("install", "--simulate", "--reinstall", "--from-paths", str(src.parent), "--ignore-src",
                        "-y", "--rosdistro=jazzy", "--os=ubuntu:noble")
    assert result.returncode != 0
    assert "Cannot locate rosdep definition for [python3-dynnet-no-such-key-pip]" in result.stdout + result.stderr


def test_our_rules_only_add_keys_rosdistro_lacks(rosdep):
    """Each key in rosdep/dynnet_ros.yaml is used by package.xml and defined nowhere upstream."""
    ours = yaml.safe_load(OUR_RULES.read_text())
    assert ours, f"{OUR_RULES} defines no keys"
    unused = set(ours) - set(package_keys(ROOT / "package.xml"))
    assert not unused, f"rosdep/dynnet_ros.yaml has keys package.xml does not use: {sorted(unused)}"
    for key in ours:
        result = rosdep.run("where-defined", key)
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stdout.split() == [OUR_RULES.as_uri()], f"{key} is also defined upstream: {result.stdout}"
