"""What `ros2 launch dynnet_ros vehicle.launch.py ARGS` does (the `ros2` CLI has no wheel): one
LaunchService that includes the installed launch file with the given `name:=value` arguments.

    python test/_launch_runner.py PATH/TO/vehicle.launch.py [use_sim:=false] [config:=FILE] ...
"""
from __future__ import annotations

import sys

from launch import LaunchDescription, LaunchService
from launch.actions import IncludeLaunchDescription
from launch.launch_description_sources import AnyLaunchDescriptionSource


def main(argv: list[str]) -> int:
    path, args = argv[0], argv[1:]
    pairs = [tuple(arg.split(":=", 1)) for arg in args]
    service = LaunchService(argv=args)
    service.include_launch_description(LaunchDescription([
        IncludeLaunchDescription(AnyLaunchDescriptionSource(path), launch_arguments=pairs)]))
    return service.run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
