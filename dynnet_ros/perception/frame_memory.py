"""What a model node holds per frame outside its engine, charged to the node's memory budget.

Why: a node's budget bounds its RSS growth since before the model loaded, and the engine is not
the only thing growing — the camera messages in flight, the model-input tensor the perception
core fills and the post-processing arrays are the node's too. The node hands its engine
``budget - frame_bytes`` (docs/budget.md, "node memory"). Plain numpy, no ROS imports.
"""
from __future__ import annotations

from dataclasses import dataclass

from dynnet_ros.bytesize import to_mb
from dynnet_ros.perception.letterbox import CHUNK_ROWS, Letterbox

#: Camera messages alive at once in the worst case: the DDS reader's history (keep-last 1), the
#: C message and its Python copy while rclpy converts the next frame, the one-slot mailbox, and
#: the frame being processed (the core reads an rgb8 frame as a view over the message).
MESSAGE_COPIES = 5
#: Resize temporaries per chunk, in float32 rows of the wider of source and target width.
SCRATCH_ROWS_FACTOR = 10


@dataclass(frozen=True)
class FrameBytes:
    """What a model node holds for one frame outside its engine, in bytes (see module doc)."""

    messages: int   # MESSAGE_COPIES camera messages
    inputs: int     # the model-input tensors the core fills (reused from frame to frame)
    scratch: int    # downscale temporaries (preprocessing only)
    outputs: int    # post-processing arrays and the output message (after the engine ran)

    @property
    def total(self) -> int:
        # scratch and outputs are never alive together, nor while the engine runs
        return self.messages + self.inputs + max(self.scratch, self.outputs)

    @property
    def total_mb(self) -> float:
        return to_mb(self.total)


def frame_bytes(message_bytes: int, letterbox: Letterbox, *, input_channels: int = 3,
                output_bytes_per_pixel: float = 0.0, output_const_bytes: int = 0) -> FrameBytes:
    """The node's own frame memory for a camera message of ``message_bytes`` placed into the
    model input as ``letterbox``; ``output_bytes_per_pixel`` is per camera pixel (the task's
    result arrays at camera size and the output message)."""
    scaled = (letterbox.new_h, letterbox.new_w) != (letterbox.src_h, letterbox.src_w)
    pixels = letterbox.src_h * letterbox.src_w
    scratch = SCRATCH_ROWS_FACTOR * CHUNK_ROWS * max(letterbox.src_w, letterbox.new_w) * 4 if scaled else 0
    return FrameBytes(messages=MESSAGE_COPIES * int(message_bytes),
                      inputs=input_channels * letterbox.pad_h * letterbox.pad_w * 4,
                      scratch=scratch, outputs=int(output_bytes_per_pixel * pixels) + output_const_bytes)


__all__ = ["MESSAGE_COPIES", "FrameBytes", "frame_bytes"]
