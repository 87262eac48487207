"""Banded stem: a network's first convolution and its readers computed in horizontal bands.

Why: a CNN's memory peak is usually at its stem. The first convolution's full-resolution output
(gated: 32 channels at 320x320, 12.5 MB at a 640x640 input) must coexist with the second
convolution's output, and no execution order or arena plan can go below that pair. Computing the
pair band by band needs only a band of the first output at a time: the pair's rows are
independent given a halo, so each band of the second convolution's output comes from a band of
the first's, which comes from a band of the image. Each band runs the two convolutions as
onnxruntime sessions whose vertical padding is set per band (first and last bands pad, the
ones in between read real rows instead), so the values are exactly those of the whole
convolution. Band buffers live in the planned arena as one workspace of the banded segment.

Tensors may be in onnxruntime's blocked NCHWc layout ([N, C/b, H, W, b] in memory for an NCHW
shape with C padded to the block b): a band of rows is then b-blocked too, which is why copies
into and out of bands reshape to (N, C/b, H, W*b) — b = 1 is plain NCHW.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import onnxruntime as ort

from dynnet_ros.engine.modelio.onnx_proto import NodeProto, get_attribute_value, make_attribute

NCHWC = "com.microsoft.nchwc"
# convolutions whose rows can be banded: ONNX Conv, onnxruntime's NCHWc Conv and FusedConv (conv +
# activation; our simplification and onnxruntime's both write it) — all without a summed input
_CONVS = {("", "Conv"), ("ai.onnx", "Conv"), (NCHWC, "Conv"), ("com.microsoft", "FusedConv")}


def _is_conv(node: NodeProto) -> bool:
    return (node.domain, node.op_type) in _CONVS and len([i for i in node.input if i]) <= 3


@dataclass(frozen=True)
class RowGeometry:
    """A convolution along the row axis: kernel, stride, top/bottom padding (dilation 1)."""

    kernel: int
    stride: int
    pad_top: int
    pad_bottom: int

    def out_rows(self, rows: int, pad_top: int | None = None, pad_bottom: int | None = None) -> int:
        top = self.pad_top if pad_top is None else pad_top
        bottom = self.pad_bottom if pad_bottom is None else pad_bottom
        return (rows + top + bottom - self.kernel) // self.stride + 1

    def input_rows(self, first: int, end: int) -> tuple[int, int]:
        """Input rows [lo, hi) (in padded coordinates: may be < 0 or past the end) that output
        rows [first, end) read."""
        return self.stride * first - self.pad_top, self.stride * (end - 1) - self.pad_top + self.kernel


@dataclass(frozen=True)
class Band:
    """One band: output rows of the second conv, the first conv's rows and the image rows it
    needs, and the vertical padding each conv uses for this band."""

    out: tuple[int, int]
    mid: tuple[int, int]
    mid_pads: tuple[int, int]
    image: tuple[int, int]
    image_pads: tuple[int, int]


def plan_bands(height: int, first: RowGeometry, second: RowGeometry, bands: int) -> list[Band]:
    """Split the pair's output rows into ``bands`` bands (fewer if there are fewer rows)."""
    mid_rows = first.out_rows(height)
    out_rows = second.out_rows(mid_rows)
    count = max(1, min(bands, out_rows))
    bounds = [round(j * out_rows / count) for j in range(count + 1)]
    plan = []
    for a, b in zip(bounds, bounds[1:]):
        lo, hi = second.input_rows(a, b)
        c, d = max(lo, 0), min(hi, mid_rows)
        lo0, hi0 = first.input_rows(c, d)
        r0, r1 = max(lo0, 0), min(hi0, height)
        plan.append(Band((a, b), (c, d), (c - lo, hi - d), (r0, r1), (r0 - lo0, hi0 - r1)))
    return plan


def _attrs(node: NodeProto) -> dict:
    return {a.name: get_attribute_value(a) for a in node.attribute}


def _geometry(node: NodeProto) -> RowGeometry | None:
    """The conv's row geometry, or None if it is not a plain 2-D convolution we can band."""
    attrs = _attrs(node)
    kernel = attrs.get("kernel_shape")
    pads = attrs.get("pads") or [0, 0, 0, 0]
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if not kernel or len(kernel) != 2 or auto_pad != "NOTSET" or any(d != 1 for d in attrs.get("dilations", [1, 1])):
        return None
    strides = attrs.get("strides") or [1, 1]
    return RowGeometry(int(kernel[0]), int(strides[0]), int(pads[0]), int(pads[2]))


def find_stem(graph, sizes: Mapping[str, int | None], min_bytes: int) -> tuple[int, list[int]] | None:
    """Node indices (first, seconds) of a bandable stem: a conv reading a 4-D graph input whose
    readers are all convs with the same row geometry, with the intermediate at least ``min_bytes``
    at the reference shape."""
    for index, node in enumerate(graph.nodes):
        if not _is_conv(node) or node.input[0] not in graph.inputs:
            continue
        mid = node.output[0]
        readers = graph.consumers.get(mid, [])
        if not readers or mid in graph.outputs or (sizes.get(mid) or 0) < min_bytes or _geometry(node) is None:
            return None
        seconds = [graph.nodes[r] for r in readers]
        if any(not _is_conv(s) or s.input[0] != mid or mid in s.input[1:] or s.output[0] in graph.outputs
               for s in seconds):
            return None
        geometries = {_geometry(s) for s in seconds}
        if len(geometries) != 1 or None in geometries:
            return None
        return index, sorted(set(readers))
    return None


def _with_row_pads(node: NodeProto, top: int, bottom: int) -> NodeProto:
    copy = NodeProto()
    copy.CopyFrom(node)
    pads = list(_attrs(node).get("pads") or [0, 0, 0, 0])
    pads[0], pads[2] = top, bottom
    for attr in copy.attribute:
        if attr.name == "pads":
            del attr.ints[:]
            attr.ints.extend(pads)
            break
    else:
        copy.attribute.append(make_attribute("pads", pads))
    copy.name = f"{node.name}_band_{top}_{bottom}"
    return copy


@dataclass
class BandedStats:
    runs: int = 0
    bands: int = 0


def _view(views: Mapping[str, np.ndarray | None], name: str) -> np.ndarray:
    """The arena view the executor planned for ``name`` (every output and the workspace get one)."""
    view = views.get(name)
    if view is None:
        raise ValueError(f"no arena view for {name!r}: the memory plan must place the stem's tensors")
    return view


@dataclass
class BandedRunner:
    """Runs the stem's convolutions band by band (the segment's work; see module docstring).

    ``make_session(node)`` compiles one node into an onnxruntime session over the shared weights.
    """

    first: NodeProto
    seconds: list[NodeProto]           # every reader of the first conv's output (same row geometry)
    make_session: Callable[[NodeProto], ort.InferenceSession]
    block_size: int
    mid_channels: int                       # the first conv's output channels (padded if blocked)
    bands: int = 4
    workspace: str = "__stem_workspace"
    stats: BandedStats = field(default_factory=BandedStats)

    def __post_init__(self) -> None:
        first, second = _geometry(self.first), _geometry(self.seconds[0])
        if first is None or second is None:
            raise ValueError(f"stem {self.first.name!r} is not a pair of plain 2-D convolutions (see find_stem)")
        self.geometry = (first, second)
        # every vertical padding a band can need, compiled now (weights may be dropped after build)
        self.sessions: dict[tuple[int, int, int], ort.InferenceSession] = {}
        for which, node in enumerate([self.first, *self.seconds]):
            geometry = self.geometry[0 if which == 0 else 1]
            for top in range(geometry.pad_top + 1):
                for bottom in range(geometry.pad_bottom + 1):
                    self.sessions[which, top, bottom] = self.make_session(_with_row_pads(node, top, bottom))
        self._plans: dict[int, list[Band]] = {}

    @property
    def image(self) -> str:
        return self.first.input[0]

    @property
    def outputs(self) -> list[str]:
        return [s.output[0] for s in self.seconds]

    def band_plan(self, height: int) -> list[Band]:
        plan = self._plans.get(height)
        if plan is None:
            plan = self._plans[height] = plan_bands(height, *self.geometry, self.bands)
        return plan

    def mid_shape(self, image_shape) -> tuple[int, int, int, int]:
        """Shape of the first conv's whole output (never materialised) for this input."""
        attrs = _attrs(self.first)
        kernel, strides = attrs["kernel_shape"], attrs.get("strides") or [1, 1]
        pads = attrs.get("pads") or [0, 0, 0, 0]
        n, _, height, width = image_shape
        columns = (width + pads[1] + pads[3] - kernel[1]) // strides[1] + 1
        return int(n), self.mid_channels, self.geometry[0].out_rows(int(height)), int(columns)

    def workspace_bytes(self, image_shape, out_shapes: list[tuple[int, ...]]) -> int:
        """Bytes for the largest band of image, intermediate and (one at a time) outputs."""
        mid_shape = self.mid_shape(image_shape)
        row_image = int(np.prod(image_shape)) // image_shape[2] * 4
        row_mid = int(np.prod(mid_shape)) // mid_shape[2] * 4
        row_out = max(int(np.prod(shape)) // shape[2] * 4 for shape in out_shapes)
        return max(_align((b.image[1] - b.image[0]) * row_image) + _align((b.mid[1] - b.mid[0]) * row_mid)
                   + _align((b.out[1] - b.out[0]) * row_out) for b in self.band_plan(int(image_shape[2])))

    def run(self, values: Mapping[str, np.ndarray], views: Mapping[str, np.ndarray | None]) -> dict[str, np.ndarray]:
        """``views``: the arena views of the outputs and of the workspace (bytes)."""
        image = values[self.image]
        workspace = _view(views, self.workspace)
        n, c_in, height, width = image.shape
        _, c_mid, _, w_mid = self.mid_shape(image.shape)
        for band in self.band_plan(height):
            rows_in, rows_mid, rows_out = (band.image[1] - band.image[0], band.mid[1] - band.mid[0],
                                           band.out[1] - band.out[0])
            size_in, size_mid = rows_in * n * c_in * width * 4, rows_mid * n * c_mid * w_mid * 4
            img = workspace[:size_in].view(np.float32).reshape(n, c_in, rows_in, width)
            np.copyto(img, image[:, :, band.image[0]:band.image[1], :])
            mid_at = _align(size_in)
            mid = workspace[mid_at:mid_at + size_mid].view(np.float32).reshape(n, c_mid, rows_mid, w_mid)
            self._run(self.sessions[(0,) + band.image_pads], img, mid)
            out_at = mid_at + _align(size_mid)
            for which, node in enumerate(self.seconds, start=1):
                out = _view(views, node.output[0])
                _, c_out, h_out, w_out = out.shape
                k = self.block_size if node.domain == NCHWC else 1
                part = workspace[out_at:out_at + rows_out * n * c_out * w_out * 4].view(np.float32)
                part = part.reshape(n, c_out, rows_out, w_out)
                self._run(self.sessions[(which,) + band.mid_pads], mid, part)
                rows = out.reshape(n, c_out // k, h_out, w_out * k)
                rows[:, :, band.out[0]:band.out[1], :] = part.reshape(n, c_out // k, rows_out, w_out * k)
            self.stats.bands += 1
        self.stats.runs += 1
        return {name: _view(views, name) for name in self.outputs}

    @staticmethod
    def _run(session: ort.InferenceSession, source: np.ndarray, target: np.ndarray) -> None:
        io = session.io_binding()
        io.bind_input(session.get_inputs()[0].name, "cpu", 0, np.float32, source.shape, source.ctypes.data)
        io.bind_output(session.get_outputs()[0].name, "cpu", 0, np.float32, target.shape, target.ctypes.data)
        session.run_with_iobinding(io)

    def close(self) -> None:
        self.sessions.clear()


def _align(nbytes: int, to: int = 64) -> int:
    return (nbytes + to - 1) // to * to
