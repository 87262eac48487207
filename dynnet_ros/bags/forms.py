"""What the bag library reads and writes, named without importing it.

Why a module of its own: the CLI's argument definitions (``dynnet replay``, ``dynnet sim``) list
these in their help, and ``--help`` must not load rosbags.
"""
from __future__ import annotations

#: the bags ``bags.reader.Bag`` opens, as its errors and the CLI's help name them
BAG_FORMS = "a rosbag2 directory (with metadata.yaml), a .db3 or .mcap file, or a ROS 1 .bag file"
#: the rosbag2 storages ``bags.writer.BagWriter`` writes
STORAGE_NAMES: tuple[str, ...] = ("mcap", "sqlite3")
