"""Map-and-Conquer: multi-exit stages that run concurrently on several compute units.

``hardware`` describes the units (files in ``config/hardware/`` or this machine, discovered);
the stage graph, the stage runtime, the profiler, cost model and search live in sibling modules.
No ROS imports (docs/mapper.md).
"""
from .hardware import ComputeUnit, DvfsLevel, Exchange, Hardware, load_hardware

__all__ = ["ComputeUnit", "DvfsLevel", "Exchange", "Hardware", "load_hardware"]
