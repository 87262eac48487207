"""dynnet_ros: several dynamic-shape DNNs under one memory budget, on ROS 2."""

__version__ = "0.1.0"
