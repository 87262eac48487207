"""`dynnet replay`'s arguments; its implementation is dynnet_ros.commands.replay."""
from __future__ import annotations

import argparse

from dynnet_ros.bags.forms import BAG_FORMS
from dynnet_ros.bags.topics import Remap, parse_remap
from dynnet_ros.commands import arguments

NAME = "replay"
HELP = "play a rosbag2 (sqlite3/MCAP) or ROS 1 bag into the vehicle graph on the bag's time (/clock)"


#: how long a camera frame waits, at most, for the model nodes to finish the previous one (a node


#: that crashed is restarted meanwhile); after that it goes out and the report shows the loss
FRAME_WAIT_S = 60.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bag", nargs="?", default=None, metavar="BAG", help=f"the bag: {BAG_FORMS}")
    parser.add_argument("--rate", type=arguments.positive_float, default=1.0, metavar="R",
                        help="bag seconds per wall second (default 1; 0.5 = half speed)")
    parser.add_argument("--loop", action="store_true", help="play the bag again and again until Ctrl-C")
    parser.add_argument("--topics", nargs="+", default=None, metavar="T",
                        help="play only these bag topics (default: every topic whose type ROS knows)")
    parser.add_argument("--remap", nargs="+", type=remap_rule, default=[], metavar="FROM:=TO",
                        help="publish bag topic FROM as TO (e.g. /front/image_raw:=/camera/image_raw)")
    parser.add_argument("--config", type=arguments.existing_file, default=None,
                        help="graph description (default: the package's config/vehicle.yaml)")
    parser.add_argument("--namespace", type=arguments.ros_namespace, default="", metavar="NS",
                        help="run the graph under NS and publish the bag's topics under it (/clock stays global)")
    parser.add_argument("--no-graph", action="store_true",
                        help="start no nodes: play into a graph that is already running")
    parser.add_argument("--linger", type=arguments.positive_float, default=5.0, metavar="S",
                        help="seconds the graph keeps running after the last message, /clock still advancing, "
                             "so the nodes finish their last frames (default 5)")
    parser.add_argument("--record", type=arguments.bag_output, default=None, metavar="OUT",
                        help="record the played topics and every output of the graph on the bag's time: OUT.mcap = "
                             "one MCAP file, any other name = a rosbag2 directory (docs/bags.md)")
    parser.add_argument("--realtime", action="store_true",
                        help="play on the bag's clock alone, as a live camera would: a frame a busy model node "
                             "cannot take is dropped (and reported); default: each camera frame waits until every "
                             "model node finished the previous one")
    parser.add_argument("--frame-timeout", type=arguments.positive_float, default=FRAME_WAIT_S, metavar="S",
                        help="how long a camera frame waits, at most, for the model nodes to finish the previous "
                             f"one (default {FRAME_WAIT_S:g})")
    parser.add_argument("--strict", action="store_true",
                        help="exit with status 1 when a model node did not process every camera frame played")
    parser.add_argument("--json", type=arguments.output_file, default=None, metavar="FILE",
                        help="write what was played (messages per topic, passes, exit codes) as JSON")


def remap_rule(text: str) -> Remap:
    """``FROM:=TO`` (argparse type)."""
    try:
        return parse_remap(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
