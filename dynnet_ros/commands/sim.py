"""`dynnet sim --record OUT`: write the sensor simulator's frames into a bag, no ROS graph needed.

The frames are the ones the live ``sensor_sim`` node publishes with the same settings and seed
(camera Image, CameraInfo, LiDAR PointCloud2, same topics and frame_ids), stamped at exactly
``1 / rate`` apart from a fixed start, so the same arguments always write the same messages:
a bag made by our own code for replay tests and demos (``dynnet replay OUT``). With
``--cameras N`` the simulator has the N cameras of ``dynnet demo --cameras N`` (NAME/image_raw,
NAME/camera_info), all stamped with the frame's stamp, and its LiDAR covers them.
"""
from __future__ import annotations

import argparse
import json

from rich.progress import Progress

from dynnet_ros.bags.scenes import DEFAULT_START_NS, frame_count, record_scenes, sim_topics
from dynnet_ros.bags.writer import check_output
from dynnet_ros.commands import CommandError
from dynnet_ros.commands.parsers.sim import DEFAULT_DURATION_S
from dynnet_ros.sim.frames import SimSettings
from dynnet_ros.sim.rig import SINGLE_CAMERA, demo_cameras, rig_cameras


def run(args: argparse.Namespace) -> int:
    if args.record is None:
        raise CommandError("give the bag to write with --record OUT")
    settings = SimSettings(rate_hz=args.rate, encoding=args.encoding, resolutions=tuple(args.resolutions),
                           resolution_period_s=args.resolution_period, pedestrians=args.pedestrians,
                           seed=args.seed)
    duration = DEFAULT_DURATION_S if args.frames is None and args.duration is None else args.duration
    count = frame_count(settings, frames=args.frames, duration_s=duration)
    cameras = rig_cameras(demo_cameras(args.cameras)) if args.cameras > 1 else []
    out = check_output(args.record, args.format)
    with Progress(transient=True) as progress:
        bar = progress.add_task(f"recording {out.name}", total=count)
        counts = record_scenes(out, settings, count, storage=args.format,
                               on_frame=lambda _index: progress.advance(bar), compress=args.compress, cameras=cameras)
    print(f"dynnet sim: wrote {count} frames ({', '.join(f'{n} {t}' for t, n in counts.items())}) "
          f"to {out}, seed {settings.seed}")
    if args.json is not None:
        types = sim_topics(args.compress, [c.name for c in cameras] or [SINGLE_CAMERA])
        args.json.write_text(json.dumps({
            "path": str(out), "storage": args.format, "frames": count, "seed": settings.seed,
            "rate_hz": settings.rate_hz, "resolutions": list(settings.resolutions),
            "resolution_period_s": settings.resolution_period_s, "encoding": settings.encoding,
            "pedestrians": settings.pedestrians, "start_ns": DEFAULT_START_NS,
            "compress": args.compress,
            "cameras": {c.name: c.yaw_deg for c in cameras} or {SINGLE_CAMERA: 0.0},
            "topics": {topic: {"type": types[topic][0], "messages": n} for topic, n in counts.items()},
        }, indent=2))
    return 0
