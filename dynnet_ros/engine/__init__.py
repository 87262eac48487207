"""ONNX analysis, planning and execution. No ROS imports anywhere below this package."""
from dynnet_ros.engine.engine import Engine

__all__ = ["Engine"]
