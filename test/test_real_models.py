"""The planned Engine on pretrained models this project was not developed against (test/_corpus.py):
a YOLOv8 detector, PP-OCR's DB text detector (a segmenter), SVTR text recogniser (attention) and
Paddle-exported direction classifier (``-1`` batch dim), and Silero's voice-activity models
(LSTM inside ``If``, a rank-0 sample-rate input).

Each model runs at three input shapes with outputs equal to onnxruntime's (none through the
Engine's plain-onnxruntime path for feeds outside a model's declaration), and takes budgets of
100, 50 and 25 % of its weights on top of its footprint besides weights, or refuses one with its
minimum in the message.

Tolerance: the planned engine runs the same onnxruntime kernels, but split into segment sessions
with its own fusions and the blocked (NCHWc) layout, so float32 sums may be associated
differently than in one session; over dozens of layers that is a few float32 ulps of the
outputs' scale (measured: ≤ 5e-6 absolute on the recogniser's probabilities, 0 on the others),
well inside rtol 1e-4 / atol 1e-5.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnxruntime as ort
import pytest
from _corpus import CorpusModel, by_name, pytest_params

from dynnet_ros.bytesize import MB
from dynnet_ros.engine import Engine
from dynnet_ros.engine.backends.cpu_planned import create_planned_executor
from dynnet_ros.engine.runtime.executor import PlannedExecutor

RTOL, ATOL = 1e-4, 1e-5
BUDGET_FRACTIONS = (1.0, 0.5, 0.25)


@dataclass
class Case:
    model: CorpusModel
    engine: Engine
    session: ort.InferenceSession
    feeds: list[dict[str, np.ndarray]]

    def reference(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.session.run(None, feeds)


@pytest.fixture(scope="module", params=pytest_params())
def case(request):
    """One planned Engine and one onnxruntime session per corpus model, shared by the tests."""
    model: CorpusModel = request.param
    path = str(model.path())
    engine = Engine(path)
    yield Case(model, engine, ort.InferenceSession(path, providers=["CPUExecutionProvider"]),
               model.feeds(np.random.default_rng(0)))
    engine.close()


def _assert_close(got: dict[str, np.ndarray], want: list[np.ndarray], where: str) -> None:
    assert len(got) == len(want), where
    for (name, value), expected in zip(got.items(), want):
        assert value.shape == expected.shape, f"{where} {name}"
        np.testing.assert_allclose(value, expected, rtol=RTOL, atol=ATOL, err_msg=f"{where} {name}")


def test_outputs_equal_onnxruntime_at_three_shapes(case):
    signatures = {tuple((k, v.shape) for k, v in feeds.items()) for feeds in case.feeds}
    assert len(case.feeds) >= 3 and len(signatures) == len(case.feeds)
    for feeds in case.feeds:
        where = f"{case.model.name} at {[list(v.shape) for v in feeds.values()]}"
        _assert_close(case.engine.run(feeds), case.reference(feeds), where)
    # every feed is inside the model's declaration: none needed the plain-onnxruntime path
    assert case.engine.plain_reason is None and case.engine._reference.runs == 0
    assert case.engine.stats()["runs"] == len(case.feeds)


@pytest.mark.slow
def test_budgets_of_a_share_of_the_weights_run_or_state_the_minimum(case):
    """A budget for a share of the weights: the in-memory level (the engine's footprint besides
    weights at the input size, its calibration, plus every weight) less the other share of the
    weight bytes. Each is accepted (the run equals
    onnxruntime's, with no more weights resident than the window allows) or refused with the
    minimum it is below; whether it is accepted follows ``min_budget_mb`` exactly."""
    feeds = case.feeds[0]
    shapes = {name: value.shape for name, value in feeds.items()}
    with Engine(str(case.model.path()), swappable=True, input_shapes=shapes) as engine:
        engine.run(feeds)  # the frame's small integer inputs (silero's sample rate) feed the calibration
        minimum = engine.min_budget_mb()
        inmemory = engine.latency_table()[-1][0]  # the level with every weight resident
        engine.set_memory_budget(inmemory)
        window = engine.engine_stats().window
        assert window is not None and window.nonweight_bytes > 0
        outcomes = {}
        for share in BUDGET_FRACTIONS:
            budget = inmemory - (1.0 - share) * window.weight_span_bytes / MB
            if budget < minimum:
                with pytest.raises(ValueError, match=f"minimum {minimum:.1f} MB"):
                    engine.set_memory_budget(budget)
                outcomes[share] = "refused"
                continue
            engine.set_memory_budget(budget)
            _assert_close(engine.run(feeds), case.reference(feeds), f"{case.model.name} under {budget:.1f} MB")
            now = engine.engine_stats().window
            assert now.budget_bytes is not None and now.resident_weight_bytes <= now.allowance_bytes
            outcomes[share] = "accepted"
        # the share that the heaviest segment's weights need is the only reason to refuse
        assert outcomes[1.0] == "accepted", outcomes


@pytest.fixture(scope="module")
def classifier() -> CorpusModel:
    model = by_name("ppocr-direction-classifier")
    if not model.available():
        pytest.skip(model.skip_reason)
    return model


def test_text_lines_are_planned_at_their_own_height(classifier):
    """The cut choice weighs the classifier at the size its engine is told it will be fed
    (``input_shapes``: PP-OCR's 48-pixel lines), not at a 640-pixel square. At neither size
    does a cut set save against one lean session, so both run as one."""
    path = str(classifier.path())
    with Engine(path) as square, Engine(path, input_shapes=classifier.input_shapes) as lines:
        for engine in (square, lines):
            assert engine.stats()["executor"] == "cpu" and engine.stats()["plan"]["fallback"]
        at_square, at_lines = (e.stats()["plan"]["cuts"]["onnxruntime_activation_bytes"] for e in (square, lines))
        assert at_lines * 10 < at_square  # 48 x 192 against 640 x 640
        feeds = classifier.feeds(np.random.default_rng(0))[0]
        reference = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
        _assert_close(lines.run(feeds), reference, "classifier sized at its lines")


def test_a_line_shorter_than_the_last_pooling_window_runs_as_onnxruntime_runs_it(classifier):
    """A 32-pixel line leaves the last pooling window overhanging its input by less than a stride:
    onnxruntime truncates to one output row, and so does the planned engine (cut without the
    cost model, which would run the classifier as one session)."""
    path = str(classifier.path())
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    executor = create_planned_executor(path, cost_model=False)
    try:
        assert isinstance(executor, PlannedExecutor)
        for shape in ((1, 3, 32, 192), (2, 3, 32, 100)):
            feeds = {"x": np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)}
            _assert_close(executor.run(feeds), session.run(None, feeds), f"classifier at {list(shape)}")
    finally:
        executor.close()
