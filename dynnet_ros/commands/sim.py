"""`dynnet sim --record OUT`: write the sensor simulator's frames into a bag, no ROS graph needed.

The frames are the ones the live ``sensor_sim`` node publishes with the same settings and seed
(camera Image, CameraInfo, LiDAR PointCloud2, same topics and frame_ids), stamped at exactly
``1 / rate`` apart from a fixed start, so the same arguments always write the same messages:
a bag made by our own code for replay tests and demos (``dynnet replay OUT``).
"""
from __future__ import annotations

import argparse
import json

from rich.progress import Progress

from dynnet_ros.bags.scenes import DEFAULT_START_NS, frame_count, record_scenes, sim_topics
from dynnet_ros.bags.writer import STORAGES, check_output
from dynnet_ros.commands import CommandError, arguments
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
    parser.add_argument("--format", choices=sorted(STORAGES), default="mcap",
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
    parser.add_argument("--pedestrians", type=int, choices=range(6), default=defaults.pedestrians, metavar="0..5",
                        help="pedestrians in the scene (default %(default)s)")
    parser.add_argument("--json", type=arguments.output_file, default=None, metavar="FILE",
                        help="write the bag's path, settings and messages per topic as JSON")


def run(args: argparse.Namespace) -> int:
    if args.record is None:
        raise CommandError("give the bag to write with --record OUT")
    settings = SimSettings(rate_hz=args.rate, encoding=args.encoding, resolutions=tuple(args.resolutions),
                           resolution_period_s=args.resolution_period, pedestrians=args.pedestrians,
                           seed=args.seed)
    duration = DEFAULT_DURATION_S if args.frames is None and args.duration is None else args.duration
    count = frame_count(settings, frames=args.frames, duration_s=duration)
    out = check_output(args.record, args.format)
    with Progress(transient=True) as progress:
        bar = progress.add_task(f"recording {out.name}", total=count)
        counts = record_scenes(out, settings, count, storage=args.format,
                               on_frame=lambda _index: progress.advance(bar), compress=args.compress)
    print(f"dynnet sim: wrote {count} frames ({', '.join(f'{n} {t}' for t, n in counts.items())}) "
          f"to {out}, seed {settings.seed}")
    if args.json is not None:
        args.json.write_text(json.dumps({
            "path": str(out), "storage": args.format, "frames": count, "seed": settings.seed,
            "rate_hz": settings.rate_hz, "resolutions": list(settings.resolutions),
            "resolution_period_s": settings.resolution_period_s, "encoding": settings.encoding,
            "pedestrians": settings.pedestrians, "start_ns": DEFAULT_START_NS,
            "compress": args.compress,
            "topics": {topic: {"type": sim_topics(args.compress)[topic][0], "messages": n}
                       for topic, n in counts.items()},
        }, indent=2))
    return 0
