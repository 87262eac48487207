"""The TensorRT executor's glue, run against a stand-in for ``tensorrt`` and ``pycuda.driver``.

This is NOT a TensorRT test (test_trt_gpu.py is, and it is skipped without a GPU). The stand-in
implements exactly the calls tensorrt.py makes, with TensorRT's rules where they matter to the
glue (an enqueue fails unless every input shape lies in the *active* profile and every input has
an address; outputs go through the IOutputAllocator; device memory is separate from host memory),
and computes with onnxruntime. It checks what never ran on real hardware here: call order, byte
copies, dtype conversions, data-dependent output shapes, profile switching, the on-disk cache and
the background rebuild.
"""
from __future__ import annotations

import ctypes
import itertools
import json
import sys
import types

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from dynnet_ros.engine.backends.cpu import OrtExecutor
from dynnet_ros.engine.backends.trt_config import TrtOptions
from dynnet_ros.zoo import ensure_model, example_inputs

_ADDRESSES = itertools.count(1 << 40)  # fake device addresses, far from any host pointer


def fake_modules(dla_cores: int = 0):
    """(tensorrt, pycuda, pycuda.driver, record) stand-ins; ``record`` counts builds etc."""
    record = {"builds": 0, "configs": [], "profile_switches": 0}
    memory: dict[int, bytearray] = {}

    # ------------------------------------------------------------------ pycuda.driver
    class DeviceAllocation:
        def __init__(self, size):
            self.address = next(_ADDRESSES)
            memory[self.address] = bytearray(size)

        def __int__(self):
            return self.address

        def free(self):
            memory.pop(self.address, None)

    def read(address, nbytes):
        if address in memory:
            return bytes(memory[address][:nbytes])
        return ctypes.string_at(address, nbytes)  # a host pointer (shape-tensor inputs)

    class Context:
        depth = 0

        def push(self):
            Context.depth += 1

        @staticmethod
        def pop():
            assert Context.depth > 0, "pop without push"
            Context.depth -= 1

        def detach(self):
            record["detached"] = True

    class Device:
        def __init__(self, index):
            self.index = index

        @staticmethod
        def count():
            return 1

        def name(self):
            return "FakeGPU"

        def compute_capability(self):
            return (8, 7)

        def retain_primary_context(self):
            return Context()

    def need_context():
        assert Context.depth > 0, "CUDA call without a current context"

    def memcpy_htod(dest, src):
        need_context()
        memory[int(dest)][:src.nbytes] = src.tobytes()

    def memcpy_dtoh(dest, src):
        need_context()
        dest[...] = np.frombuffer(read(int(src), dest.nbytes), dtype=dest.dtype).reshape(dest.shape)

    class Stream:
        handle = 7

        def synchronize(self):
            pass

    driver = types.SimpleNamespace(init=lambda: None, Device=Device, Context=Context, Stream=Stream,
                                   mem_alloc=lambda n: (need_context(), DeviceAllocation(n))[1],
                                   mem_get_info=lambda: (8 << 30, 16 << 30), memcpy_htod=memcpy_htod,
                                   memcpy_dtoh=memcpy_dtoh)
    pycuda = types.ModuleType("pycuda")
    pycuda.driver = driver

    # ------------------------------------------------------------------ tensorrt
    trt = types.ModuleType("tensorrt")
    trt.__version__ = "10.3.0"
    trt.Logger = type("Logger", (), {"WARNING": 2, "__init__": lambda self, level=2: None})
    trt.TensorIOMode = types.SimpleNamespace(INPUT="INPUT", OUTPUT="OUTPUT")
    trt.MemoryPoolType = types.SimpleNamespace(WORKSPACE="WORKSPACE")
    trt.BuilderFlag = types.SimpleNamespace(**{f: f for f in ("FP16", "INT8", "TF32", "GPU_FALLBACK")})
    trt.DeviceType = types.SimpleNamespace(GPU="GPU", DLA="DLA")
    trt.ExecutionContextAllocationStrategy = types.SimpleNamespace(STATIC=0, ON_PROFILE_CHANGE=1)
    trt.nptype = lambda dtype: np.dtype(dtype)  # data types are numpy dtype names here

    class IOutputAllocator:
        def __init__(self):
            pass

    trt.IOutputAllocator = IOutputAllocator

    class Network:
        def __init__(self):
            self.model = None

        @property
        def num_inputs(self):
            return len(self.model.graph.input)

        def get_input(self, i):
            return types.SimpleNamespace(name=self.model.graph.input[i].name, is_shape_tensor=False)

        num_layers = 0

    class OnnxParser:
        def __init__(self, network, logger):
            self.network = network
            self.num_errors = 0

        def parse(self, data):
            self.network.model = onnx.load_from_string(data)
            return True

    class Profile:
        def __init__(self):
            self.shapes = {}

        def set_shape(self, name, low, opt, high):
            assert all(a <= b <= c for a, b, c in zip(low, opt, high))
            self.shapes[name] = (list(low), list(high))

    class Config:
        def __init__(self):
            self.flags, self.profiles, self.pool = {"TF32"}, [], {}
            self.default_device_type, self.DLA_core = "GPU", -1

        def set_memory_pool_limit(self, pool, size):
            self.pool[pool] = size

        def set_flag(self, flag):
            self.flags.add(flag)

        def clear_flag(self, flag):
            self.flags.discard(flag)

        def add_optimization_profile(self, profile):
            self.profiles.append(profile)

        def can_run_on_DLA(self, layer):
            return True

    class Builder:
        def __init__(self, logger):
            self.num_DLA_cores, self.platform_has_fast_fp16, self.platform_has_fast_int8 = dla_cores, True, True

        def create_network(self, flags):
            assert flags == 0
            return Network()

        def create_builder_config(self):
            return Config()

        def create_optimization_profile(self):
            return Profile()

        def build_serialized_network(self, network, config):
            need_context()
            record["builds"] += 1
            record["configs"].append(config)
            header = json.dumps([p.shapes for p in config.profiles]).encode()
            return len(header).to_bytes(8, "little") + header + network.model.SerializeToString()

    trt.Builder, trt.OnnxParser = Builder, OnnxParser

    class ExecutionContext:
        def __init__(self, engine):
            self.engine, self.profile, self.shapes, self.addresses, self.allocators = engine, 0, {}, {}, {}

        def set_optimization_profile_async(self, index, stream):
            record["profile_switches"] += 1
            self.profile = index
            return 0 <= index < len(self.engine.profiles)

        def set_input_shape(self, name, shape):
            low, high = self.engine.profiles[self.profile][name]
            self.shapes[name] = tuple(shape)
            return all(a <= d <= b for a, d, b in zip(low, shape, high))

        def set_tensor_address(self, name, address):
            self.addresses[name] = int(address)

        def set_output_allocator(self, name, allocator):
            self.allocators[name] = allocator
            return True

        def get_tensor_shape(self, name):
            return self.shapes.get(name, ())

        def execute_async_v3(self, stream):
            need_context()
            feeds = {}
            for name in self.engine.inputs:
                low, high = self.engine.profiles[self.profile][name]
                shape = self.shapes[name]
                if not all(a <= d <= b for a, d, b in zip(low, shape, high)):
                    return False
                dtype = self.engine.dtypes[name]
                nbytes = int(np.prod(shape)) * dtype.itemsize
                feeds[name] = np.frombuffer(read(self.addresses[name], nbytes), dtype=dtype).reshape(shape)
            for name, value in zip(self.engine.outputs, self.engine.session.run(self.engine.outputs, feeds)):
                allocator = self.allocators[name]
                address = allocator.reallocate_output(name, 0, value.nbytes, 256)
                memory[int(address)][:value.nbytes] = value.tobytes()
                allocator.notify_shape(name, value.shape)
            return True

    class Engine:
        def __init__(self, blob):
            size = int.from_bytes(blob[:8], "little")
            self.profiles = json.loads(blob[8:8 + size])
            model = onnx.load_from_string(blob[8 + size:])
            self.session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            self.inputs = [i.name for i in model.graph.input]
            self.outputs = [o.name for o in model.graph.output]
            self.dtypes = {v.name: np.dtype(helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type))
                           for v in list(model.graph.input) + list(model.graph.output)}
            self.num_io_tensors = len(self.inputs) + len(self.outputs)

        def get_tensor_name(self, i):
            return (self.inputs + self.outputs)[i]

        def get_tensor_mode(self, name):
            return "INPUT" if name in self.inputs else "OUTPUT"

        def get_tensor_dtype(self, name):
            return self.dtypes[name].name

        def is_shape_inference_io(self, name):
            return False

        def create_execution_context(self, strategy=0):
            assert strategy == 1, "the backend asks for ON_PROFILE_CHANGE"
            return ExecutionContext(self)

    class Runtime:
        def __init__(self, logger):
            self.DLA_core = -1

        def deserialize_cuda_engine(self, blob):
            try:
                return Engine(blob)
            except Exception:
                return None

    trt.Runtime = Runtime
    return trt, pycuda, driver, record


@pytest.fixture
def fake_trt(monkeypatch):
    def install(dla_cores: int = 0):
        trt, pycuda, driver, record = fake_modules(dla_cores)
        monkeypatch.setitem(sys.modules, "tensorrt", trt)
        monkeypatch.setitem(sys.modules, "pycuda", pycuda)
        monkeypatch.setitem(sys.modules, "pycuda.driver", driver)
        return record

    return install


def _executor(options):
    from dynnet_ros.engine.backends.tensorrt import TensorRTExecutor

    return TensorRTExecutor(onnx.load(ensure_model("pedestrian")), options=options)


def test_runs_profiles_rebuilds_and_caches(fake_trt, tmp_path):
    record = fake_trt()
    model = onnx.load(ensure_model("pedestrian"))
    reference = OrtExecutor(model, threads=1)
    options = TrtOptions(shapes="H=256|320,W=320", max_profiles=2, cache_dir=tmp_path)
    executor = _executor(options)
    assert record["builds"] == 1 and len(record["configs"][0].profiles) == 2
    assert "TF32" not in record["configs"][0].flags  # fp32 really means fp32
    assert record["configs"][0].pool["WORKSPACE"] == 1 << 30
    for height in (256, 320, 256):  # two profiles, switched back and forth
        feeds = example_inputs("pedestrian", height, 320)
        got, want = executor.run(feeds), reference.run(feeds)
        assert list(got) == list(want)
        for name in want:  # boxes [N, 4] / scores [N]: shapes decided during the run
            assert got[name].dtype == want[name].dtype
            np.testing.assert_array_equal(got[name], want[name])
    assert record["profile_switches"] == 3 and executor.stats()["engine_runs"] == 3
    outside = example_inputs("pedestrian", 448, 320)
    np.testing.assert_array_equal(executor.run(outside)["boxes"], reference.run(outside)["boxes"])
    assert executor.stats()["fallback_runs"] == 1
    assert executor.wait_idle(timeout=120) and record["builds"] == 2
    np.testing.assert_array_equal(executor.run(outside)["scores"], reference.run(outside)["scores"])
    assert executor.stats()["engine_runs"] == 4 and executor.stats()["last_error"] is None
    assert len(list(tmp_path.glob("*.engine"))) == 2
    executor.close()
    assert record["detached"]

    again = _executor(options)  # same key: loaded from the cache, no build
    assert record["builds"] == 2
    np.testing.assert_array_equal(again.run(example_inputs("pedestrian", 256, 320))["boxes"],
                                  reference.run(example_inputs("pedestrian", 256, 320))["boxes"])
    again.close()
    for engine_file in tmp_path.glob("*.engine"):  # a corrupt plan is deleted and rebuilt
        engine_file.write_bytes(b"garbage")
    rebuilt = _executor(options)
    assert record["builds"] == 3 and rebuilt.stats()["engine_runs"] == 0
    rebuilt.close()


def test_dla_plan_configures_the_builder(fake_trt, tmp_path):
    record = fake_trt(dla_cores=2)
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, "H", "W"])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    from dynnet_ros.engine.backends.tensorrt import TensorRTExecutor

    executor = TensorRTExecutor(model, options=TrtOptions(precision="fp16", dla_core=1, shapes="H=32,W=64",
                                                          cache_dir=tmp_path))
    config = record["configs"][0]
    assert (config.default_device_type, config.DLA_core) == ("DLA", 1)
    assert {"FP16", "GPU_FALLBACK"} <= config.flags and "TF32" not in config.flags
    assert executor.plan.placement.device == "DLA" and executor.plan.profiles.static
    x = rng.random((1, 3, 32, 64), dtype=np.float32)
    np.testing.assert_allclose(executor.run({"x": x})["y"], OrtExecutor(model, threads=1).run({"x": x})["y"])
    executor.close()
