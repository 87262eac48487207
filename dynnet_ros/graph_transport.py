"""The DDS transport profile the graph's image publishers run with.

Why: Fast DDS sends a message through shared memory only when it fits the *publisher's*
shared-memory segment, 512 KiB by default: a 640x480 rgb8 frame (900 KiB) or a 1280x720 one
(2.7 MB) goes over UDP instead, cut into 64 KiB fragments. A best-effort reader whose process
waits for a CPU when a frame's fragments arrive overflows its socket buffer and loses the whole
frame, and on a loaded machine it can lose every frame for seconds while another reader of the
same camera gets them. ``config/fastdds_cameras.xml`` gives the participant an 8 MiB segment,
which holds a few camera frames or depth images, and larger socket buffers for what still goes
over UDP.

The segment costs its size in shared memory for each participant that has it (Fast DDS writes
it whole when the participant starts), so only processes that publish images get the profile:
the simulator, the bag player, and the model nodes whose outputs are images (a container when
it hosts one). A reader needs no profile: it maps the publisher's segment. The user's own
``FASTDDS_DEFAULT_PROFILES_FILE`` always wins, for every process.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

from dynnet_ros.graph_config import ProcessSpec, config_file

#: the environment variable Fast DDS reads its default XML profiles from
PROFILE_ENV = "FASTDDS_DEFAULT_PROFILES_FILE"
#: the package's profile for image publishers (installed in share/dynnet_ros/config)
PROFILE_FILE = "fastdds_cameras.xml"
#: executables whose nodes publish sensor_msgs/Image: camera frames, lane masks, depth images
IMAGE_PUBLISHERS = frozenset({"sensor_sim", "lane_node", "depth_node"})


def publishes_images(process: ProcessSpec) -> bool:
    """Whether any node ``process`` runs publishes images."""
    return any(node.executable in IMAGE_PUBLISHERS for node in process.hosted)


def transport_env(process: ProcessSpec, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables to add to ``environ`` for ``process``: the image publishers' profile, unless
    the process publishes no images or the user chose a profile (``environ`` has one)."""
    if PROFILE_ENV in environ or not publishes_images(process):
        return {}
    return {PROFILE_ENV: str(config_file(PROFILE_FILE))}


def use_image_profile(environ: MutableMapping[str, str] = os.environ) -> None:
    """Give this process the image publishers' profile unless the user chose one. Fast DDS reads
    the variable when the process creates its first participant, so call it before ``rclpy.init``."""
    environ.setdefault(PROFILE_ENV, str(config_file(PROFILE_FILE)))
