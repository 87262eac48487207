"""ament_python build for dynnet_ros (works with colcon and with plain pip)."""
from glob import glob

from setuptools import find_packages, setup

PACKAGE = "dynnet_ros"

# Node entry points: `ros2 run dynnet_ros <name>` finds them under lib/dynnet_ros.
NODES = {
    "sensor_sim": "dynnet_ros.nodes.sensor_sim:main",
    "lane_node": "dynnet_ros.nodes.lane_node:main",
    "pedestrian_node": "dynnet_ros.nodes.pedestrian_node:main",
    "depth_node": "dynnet_ros.nodes.depth_node:main",
    "budget_manager": "dynnet_ros.nodes.budget_manager:main",
    "foxglove_view": "dynnet_ros.nodes.foxglove_view:main",
    "recorder": "dynnet_ros.nodes.recorder:main",
    "container": "dynnet_ros.nodes.container:main",
}
# Nodes a component container loads by plugin name (`ros2 component load dynnet_ros dynnet_ros::LaneNode`);
# the same pairs as dynnet_ros.graph_config.COMPONENTS.
COMPONENTS = {
    "dynnet_ros::SensorSim": "dynnet_ros.nodes.sensor_sim:SensorSim",
    "dynnet_ros::LaneNode": "dynnet_ros.nodes.lane_node:LaneNode",
    "dynnet_ros::PedestrianNode": "dynnet_ros.nodes.pedestrian_node:PedestrianNode",
    "dynnet_ros::DepthNode": "dynnet_ros.nodes.depth_node:DepthNode",
    "dynnet_ros::BudgetManager": "dynnet_ros.nodes.budget_manager:BudgetManager",
}

setup(
    name=PACKAGE,
    version="0.1.0",
    packages=find_packages(exclude=["test", "test.*", "bench", "bench.*"]),
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
        (f"share/{PACKAGE}/launch", glob("launch/*.launch.py")),
        (f"share/{PACKAGE}/config", glob("config/*.yaml") + glob("config/*.xml")),
        (f"share/{PACKAGE}/config/hardware", glob("config/hardware/*.yaml")),
    ],
    # Runtime Python deps (pinned in requirements.txt; package.xml lists the rosdep keys).
    install_requires=["setuptools", "numpy", "onnx", "onnxruntime", "PyYAML", "psutil", "rich", "matplotlib",
                      "pymoo", "xgboost-cpu", "rosbags", "foxglove-sdk", "Pillow", "simplejpeg"],
    python_requires=">=3.10, <3.14",
    zip_safe=True,
    maintainer="dynnet_ros maintainers",
    maintainer_email="maintainers@dynnet-ros.dev",
    description="Dynamic DNNs under a memory budget on ROS 2 (RDP, SwapNet, Map-and-Conquer).",
    license="Apache-2.0",
    tests_require=["pytest"],
    entry_points={
        "console_scripts": [f"{name}={target}" for name, target in NODES.items()]
        + ["dynnet=dynnet_ros.cli:main"],
        "dynnet_ros.components": [f"{plugin}={target}" for plugin, target in COMPONENTS.items()],
    },
)
