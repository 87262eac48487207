"""A serving core's memory budget split between its frame buffers and its engine.

Why: a node's budget (``memory_budget_mb``) bounds its RSS growth since before the model loaded,
and the engine is not the only thing growing: the camera messages in flight, the model-input
tensors and the post-processing arrays are the node's too (``frame_memory``). The engine gets
the budget minus those buffers, re-computed whenever a frame of another size arrives
(docs/budget.md, "node memory").
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dynnet_ros.engine.engine import Engine
from dynnet_ros.memtrim import release_memory
from dynnet_ros.perception.frame_memory import MESSAGE_COPIES, FrameBytes, frame_bytes
from dynnet_ros.perception.letterbox import Letterbox, plan_letterbox

#: Until the first frame arrives the buffers are charged for a 640x480 rgb8 camera (the engine's
#: reference size).
DEFAULT_CAMERA = (640, 480, 3)
#: Camera messages are charged at the largest size seen this long: when the camera changes size,
#: frames of the other size are still in flight (DDS history, the middleware's copies, the
#: mailbox): the same window as the published profile's hold (budget.profile.ProfileHold).
MESSAGE_HOLD_S = 30.0
#: The letterbox side the first frame's memory is estimated with before the core decides its own
#: (the zoo's models' input size).
ESTIMATE_INPUT_SIDE = 640


@dataclass(frozen=True)
class FrameCosts:
    """What a task holds per frame besides the camera message and the 3 image channels."""

    extra_input_channels: int = 0        # model-input channels besides the image (depth: the LiDAR channel)
    output_bytes_per_pixel: float = 0.0  # post-processing per camera pixel (result arrays, output message)
    output_const_bytes: int = 64 * 1024
    input_multiple: int = 32             # the zoo models' stride (the first frame's estimate)
    in_flight: int = 1                   # batches served at once (each holds its own inputs and outputs)

    def frame_bytes(self, message_bytes: int, letterbox: Letterbox) -> FrameBytes:
        return frame_bytes(message_bytes, letterbox, input_channels=3 + self.extra_input_channels,
                           output_bytes_per_pixel=self.output_bytes_per_pixel,
                           output_const_bytes=self.output_const_bytes)

    def batch_bytes(self, message_bytes: Sequence[int], letterboxes: Sequence[Letterbox]) -> FrameBytes:
        """The buffers of ``in_flight`` such batches: the messages of every camera
        (``message_bytes``: one each, in flight whether or not in this batch; each batch in
        flight beyond the first holds one more), each batch's model input (every frame padded
        to the largest, as a batched core feeds the engine), one frame's preprocessing
        temporaries at a time per batch, and every frame's outputs. One camera, one frame, one
        batch in flight: ``frame_bytes``."""
        frames = [self.frame_bytes(0, box) for box in letterboxes]
        batches = self.in_flight
        return FrameBytes(messages=(MESSAGE_COPIES + batches - 1) * sum(int(b) for b in message_bytes),
                          inputs=batches * len(frames) * max(frame.inputs for frame in frames),
                          scratch=batches * max(frame.scratch for frame in frames),
                          outputs=batches * sum(frame.outputs for frame in frames))


class BudgetSplit:
    """The frame buffers charged now and the engine's share of the budget; one change at a time."""

    def __init__(self, costs: FrameCosts, max_input_side: int, warn: Callable[[str], None], cameras: int = 1) -> None:
        """``max_input_side``: the node's parameter (< 0: the model's own size, estimated as
        ``ESTIMATE_INPUT_SIDE``; 0: the camera's size); ``cameras``: how many send frames (each
        one's messages are in flight)."""
        self.costs = costs
        self._warn = warn
        self.lock = threading.Lock()
        width, height, channels = DEFAULT_CAMERA
        side = ESTIMATE_INPUT_SIDE if max_input_side < 0 else max_input_side
        self.frame: FrameBytes = costs.batch_bytes([width * height * channels] * cameras, [plan_letterbox(
            height, width, target=(side, side) if side else None, multiple=costs.input_multiple, scaleup=False)])
        self.engine_budget_mb: float | None = None   # what the engine was handed
        self._frame_key: tuple | None = None
        self._warned: set[tuple] = set()
        self._last_refused: tuple | None = None   # (camera size, budget) the engine refused last frame
        self._message_sizes: dict[str, list[tuple[float, int]]] = {}   # per camera: (monotonic time, bytes)

    def share(self, node_mb: float) -> float | None:
        """The engine's share of the node's budget: the budget minus the frame buffers (None: unlimited)."""
        if node_mb == 0:
            return None
        return max(float(node_mb) - self.frame.total_mb, 0.01)

    def apply(self, engine: Engine, mb: float | None) -> None:
        """Change the engine's budget in place; a replaced executor's memory goes back to the OS."""
        before = engine.engine_stats().executor
        engine.set_memory_budget(mb)
        self.engine_budget_mb = mb
        if engine.engine_stats().executor != before:  # an executor was replaced (not just its window resized)
            release_memory()

    def set_budget(self, engine: Engine, node_mb: float, commit: Callable[[], None]) -> None:
        """A new node budget: hand the engine its share now, then ``commit`` (make ``node_mb`` the
        budget the frames read), both before the next frame's charge; ValueError quoting the node
        budget."""
        with self.lock:
            share = self.share(node_mb)
            try:
                self.apply(engine, share)
            except ValueError as exc:  # quote the value set first; the engine's share follows from it
                raise ValueError(f"memory_budget_mb {node_mb:g} leaves the model {round(share or 0.0, 3):g} MB "
                                 f"after this node's {self.frame.total_mb:.1f} MB of frame buffers: {exc}") from exc
            commit()

    def charge_frames(self, engine: Engine, budget_mb: Callable[[], float], messages: Sequence[tuple[str, int]],
                      letterboxes: Sequence[Letterbox], batch: int = 1) -> None:
        """Charge a batch's buffers and give the engine the rest of the node's budget (``budget_mb()``).

        ``messages``: each frame's camera and message size; ``letterboxes``: where each goes
        in the model input; ``batch``: the largest batch the node forms now, charged whatever
        this one holds (at its largest input), so the engine's share does not swing with every
        batch of another size. Runs in the worker between two batches. Each camera's messages are
        charged at the largest size it sent in ``MESSAGE_HOLD_S`` (a camera not in this batch
        still has its messages in flight). If the engine's share is below its minimum, the engine
        goes as low as it allows and the share is retried next batch (the minimum follows the
        input size the engine last ran); a refusal that persists is warned once per size and
        budget — the published profile already asks the manager for more.
        """
        now = time.monotonic()
        for source, size in messages:
            recent = [(t, b) for t, b in self._message_sizes.get(source, []) if now - t <= MESSAGE_HOLD_S and b > size]
            self._message_sizes[source] = [*recent, (now, size)]
        held = {source: max(b for _, b in sizes) for source, sizes in self._message_sizes.items()
                if any(now - t <= MESSAGE_HOLD_S for t, _ in sizes)}  # larger frames may still be in flight
        letterbox = max(letterboxes, key=lambda box: box.pad_h * box.pad_w)
        charged = [*letterboxes, *[letterbox] * (batch - len(letterboxes))]
        key = (tuple(sorted(held.items())), tuple(charged))
        with self.lock:
            if key != self._frame_key:
                self._frame_key = key
                self.frame = self.costs.batch_bytes(list(held.values()), charged)
            node_mb = budget_mb()
            target = self.share(node_mb)
            self._last_refused, refused = None, self._last_refused
            if target is None or (target == self.engine_budget_mb and not engine_over_budget(engine)):
                return
            try:
                self.apply(engine, target)
                return
            except ValueError as exc:
                reason = str(exc)
            # Below the engine's minimum — which refers to the input size it last ran, so on the
            # first frame of a new size it may be stale: come as close as the engine allows now,
            # and retry the exact share next frame.
            closest = engine.min_budget_mb() + 0.01
            if self.engine_budget_mb is None or closest < self.engine_budget_mb:
                with contextlib.suppress(ValueError):
                    self.apply(engine, closest)
            state = (letterbox.src_w, letterbox.src_h, node_mb)
            if state == refused and state not in self._warned:  # not just a stale minimum
                self._warned.add(state)
                self._warn(f"{letterbox.src_w}x{letterbox.src_h} frames need {self.frame.total_mb:.1f} MB of frame "
                           f"buffers, leaving the model {target:.1f} MB of memory_budget_mb {node_mb:g}: {reason}; "
                           f"the model keeps {self.engine_budget_mb or 0:.1f} MB")
            self._last_refused = state

    def over_budget(self, engine: Engine, node_mb: float) -> str | None:
        """Why the model runs above its share of the node's budget now (None: it fits): the engine
        ran the frame above its budget (the input size needs more), or the share is below the
        engine's minimum at the size it just ran, so it was handed that minimum instead.

        A budget above the share whose size fits in the share is not an overrun: on the first
        frame of a new size the engine refuses the share against the previous size's minimum,
        and the next frame's charge hands it the share (``charge_frame``)."""
        over = engine.engine_stats().over_budget
        if over is not None:
            return f"{over.describe()}: running {over.overshoot_mb:.1f} MB over it"
        share, given = self.share(node_mb), self.engine_budget_mb
        if share is None or given is None or given <= share + 0.01:
            return None
        minimum = engine.min_budget_mb()
        if minimum <= share + 0.01:
            return None
        return (f"memory_budget_mb {node_mb:g} leaves the model {share:.1f} MB besides "
                f"{self.frame.total_mb:.1f} MB of frame buffers, below its minimum {minimum:.1f} MB: "
                f"it runs at {given:.1f} MB")


def engine_over_budget(engine: Engine) -> bool:
    """The engine's window is predicted above its budget: the input size changed under it.
    Setting the same budget again lets it re-size the window for the size it now runs."""
    window = engine.engine_stats().window
    if window is None or window.budget_bytes is None:
        return False
    return window.predicted_peak_bytes > window.budget_bytes + 1024
