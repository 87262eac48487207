"""Recorded data without a ROS install: rosbag2 (sqlite3, MCAP) and ROS 1 bags via rosbags.

ROS-free (rosbags and numpy only): the nodes and commands publish what this package reads.
Reading: ``reader`` (open a bag, stream its messages as CDR bytes), ``topics`` (which topics
play under which names, type checks against the graph's sensor roles), ``pacing`` (when each
message and /clock tick goes out).
"""
