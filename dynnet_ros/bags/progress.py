"""What became of each played frame: the model nodes' per-frame reports and the player's ledger.

A model node tells, on ``dynnet/frames`` (``dynnet_ros.frame_reports``: std_msgs/String, JSON
like the budget topics), what it did with every camera frame it received: processed, failed (a
bad message or an inference error), dropped (replaced in its one-frame mailbox by a newer
frame before the worker took it) or skipped (the node is disabled). ``dynnet replay`` keeps a
``FrameLedger`` of those reports against the frames it published, so it can

* hold the next frame on a camera topic until every model node reading that topic has
  finished the previous one (nothing is dropped in a mailbox: the player is paced by the
  slowest node, not by the bag's clock alone), and
* report, per node and camera topic, frames published / received / processed / dropped /
  failed, and how many were lost (published but never processed).

No ROS imports: the ledger works on stamps and names, and ``header_stamp_ns`` reads a stamp
straight from a message's CDR bytes, so the player never deserializes what it plays.
"""
from __future__ import annotations

import struct
from collections import Counter
from dataclasses import dataclass

from dynnet_ros.frame_reports import FrameOutcome

#: message types a model node takes camera frames from (raw, or image_transport's compressed)
FRAME_TYPES = ("sensor_msgs/msg/Image", "sensor_msgs/msg/CompressedImage")

def header_stamp_ns(cdr: bytes | memoryview) -> int:
    """The header stamp of a serialized message that starts with ``std_msgs/Header`` (Image,
    CompressedImage, CameraInfo, PointCloud2, ...), read from its CDR bytes: after the 4-byte
    encapsulation header come ``int32 sec`` and ``uint32 nanosec`` in the encoded byte order."""
    data = bytes(cdr[:12])
    if len(data) < 12:
        raise ValueError(f"a serialized message of {len(cdr)} bytes has no header stamp")
    order = "<" if data[1] & 1 else ">"  # CDR_LE = 0x0001, CDR_BE = 0x0000 (and their PL_ forms)
    sec, nanosec = struct.unpack(order + "iI", data[4:12])
    return sec * 1_000_000_000 + nanosec


@dataclass
class FrameCounts:
    """One node's frames from one topic, as the report lists them."""

    published: int = 0
    received: int = 0
    processed: int = 0
    dropped: int = 0
    failed: int = 0
    skipped: int = 0

    @property
    def lost(self) -> int:
        """Frames published that the node never processed, a disabled node's skipped ones aside."""
        return max(0, self.published - self.processed - self.skipped)

    def as_dict(self) -> dict[str, int]:
        return {"published": self.published, "received": self.received, "processed": self.processed,
                "dropped": self.dropped, "failed": self.failed, "skipped": self.skipped, "lost": self.lost}

    def line(self) -> str:
        text = (f"published {self.published}, received {self.received}, processed {self.processed}, "
                f"dropped {self.dropped}, failed {self.failed}")
        return text + (f", skipped {self.skipped} (disabled)" if self.skipped else "")


class FrameLedger:
    """Frames published per camera topic against the outcomes each node reported.

    ``readers`` maps a camera topic to the nodes whose reports count for it (the model nodes
    subscribed to it); a report from another node is kept in the report but never waited for.
    Stamps are counted, not just remembered, so a bag played in a loop (the same stamps again)
    waits for each pass's frame."""

    def __init__(self, readers: dict[str, list[str]]) -> None:
        self.readers = {topic: list(nodes) for topic, nodes in readers.items()}
        self._published: Counter[tuple[str, int]] = Counter()       # (topic, stamp)
        self._finished: Counter[tuple[str, str, int]] = Counter()   # (node, topic, stamp)
        self._counts: dict[tuple[str, str], FrameCounts] = {}
        self._topic_published: Counter[str] = Counter()

    def published(self, topic: str, stamp_ns: int) -> None:
        self._published[(topic, stamp_ns)] += 1
        self._topic_published[topic] += 1

    def reported(self, report: FrameOutcome) -> None:
        self._finished[(report.node, report.topic, report.stamp_ns)] += 1
        counts = self._counts.setdefault((report.node, report.topic), FrameCounts())
        counts.received += 1
        setattr(counts, report.outcome, getattr(counts, report.outcome) + 1)

    def waiting_for(self, topic: str, stamp_ns: int) -> list[str]:
        """The nodes reading ``topic`` that have not yet reported every frame published with
        this stamp."""
        due = self._published[(topic, stamp_ns)]
        return [node for node in self.readers.get(topic, []) if self._finished[(node, topic, stamp_ns)] < due]

    def counts(self) -> dict[tuple[str, str], FrameCounts]:
        """(node, topic) -> its counts, for every node that reads or reported from a played topic."""
        rows: dict[tuple[str, str], FrameCounts] = {}
        pairs = {(node, topic) for topic, nodes in self.readers.items() for node in nodes} | set(self._counts)
        for node, topic in sorted(pairs):
            got = self._counts.get((node, topic), FrameCounts())
            rows[(node, topic)] = FrameCounts(self._topic_published[topic], got.received, got.processed,
                                              got.dropped, got.failed, got.skipped)
        return rows

    def lost(self) -> dict[tuple[str, str], FrameCounts]:
        """The rows with a frame lost."""
        return {key: row for key, row in self.counts().items() if row.lost}
