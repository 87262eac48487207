"""ROS-free perception cores: exported detectors, segmenters and depth networks as functions of a frame.

Each core is built from an ONNX file and options, decides the model's format (``auto``: from its
signature and metadata) and preprocessing at construction, runs the model through ``Engine``
(budgets, plans, streamed weights) and returns typed results in source-image pixels. The model
nodes are adapters over these; ``dynnet infer`` runs them on image files. docs/models.md lists
the formats.
"""
from dynnet_ros.perception.depth import DepthEstimator
from dynnet_ros.perception.detector import Detector
from dynnet_ros.perception.results import Depth, DepthFit, Detections, Segmentation
from dynnet_ros.perception.segmenter import Segmenter

__all__ = ["Depth", "DepthEstimator", "DepthFit", "Detections", "Detector", "Segmentation", "Segmenter"]
