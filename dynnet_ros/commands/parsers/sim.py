"""`dynnet sim`'s arguments; its implementation is dynnet_ros.commands.sim."""
from __future__ import annotations

import argparse

from dynnet_ros.bags.forms import STORAGE_NAMES
from dynnet_ros.commands import arguments
from dynnet_ros.compressed import CODECS
from dynnet_ros.sim.frames import SimSettings

NAME = "sim"
HELP = "write the sensor simulator's camera, camera_info and LiDAR frames into a bag (--record OUT)"
DEFAULT_DURATION_S = 10.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = SimSettings()
    parser.add_argument("--record", type=arguments.bag_output, default=None, metavar="OUT",
                        help="bag to create (required): OUT.mcap = one MCAP file, any other name = a rosbag2 "
                             "directory")
    parser.add_argument("--format", choices=sorted(STORAGE_NAMES), default="mcap",
                        help="storage of a rosbag2 directory (default mcap; a .mcap OUT is always MCAP)")
    parser.add_argument("--seed", type=arguments.nonnegative_int, default=defaults.seed,
                        help="scene seed, as the sensor_sim node's `seed` parameter (default %(default)s)")
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--frames", type=arguments.positive_int, default=None, metavar="N",
                        help="frames to write")
    length.add_argument("--duration", type=arguments.positive_float, default=None, metavar="S",
                        help=f"seconds of simulation to write (default {DEFAULT_DURATION_S:g})")
    parser.add_argument("--rate", type=arguments.positive_float, default=defaults.rate_hz, metavar="HZ",
                        help="frame rate, 0.2..60 (default %(default)s)")
    parser.add_argument("--resolutions", type=arguments.camera_resolutions, default=defaults.resolutions,
                        metavar="WxH[,WxH...]",
                        help=f"camera resolution schedule, cycled (default {','.join(defaults.resolutions)})")
    parser.add_argument("--resolution-period", type=arguments.positive_float,
                        default=defaults.resolution_period_s, metavar="S",
                        help="seconds at each resolution (default %(default)s)")
    parser.add_argument("--encoding", choices=("rgb8", "bgr8"), default=defaults.encoding,
                        help="camera encoding (default %(default)s)")
    parser.add_argument("--compress", choices=CODECS, default=None,
                        help="write the camera as image_transport's compressed plugin publishes it: "
                             "sensor_msgs/CompressedImage (JPEG or PNG) on /camera/image_raw/compressed")
    parser.add_argument("--cameras", type=arguments.camera_count, default=1, metavar="N",
                        help="simulate N cameras as `dynnet demo --cameras N` does (1-8: front, left, right, rear, "
                             "...): NAME/image_raw and NAME/camera_info each, one LiDAR covering them (default 1: "
                             "the single camera on /camera/)")
    parser.add_argument("--pedestrians", type=int, choices=range(6), default=defaults.pedestrians, metavar="0..5",
                        help="pedestrians in the scene (default %(default)s)")
    parser.add_argument("--json", type=arguments.output_file, default=None, metavar="FILE",
                        help="write the bag's path, settings and messages per topic as JSON")
