"""Model I/O (layer 1): read, check and describe ONNX models before anything analyses them.

``onnx_proto`` holds onnx's protobuf classes and the tensor/graph helpers the engine needs,
without the onnx package (its C++ extension and ``ml_dtypes``); ``models`` loads a model (path,
bytes or ``ModelProto``) with clear errors and describes its inputs; ``loader`` reads a
*weightless* skeleton whose initializers point back into the file; ``model_check`` runs onnx's
checker once per file content in a child process; ``feeds`` validates feeds against the declared
inputs; ``ort_features`` probes what this onnxruntime can do with external weights. This
``__init__`` imports nothing, so each module's first import loads only what it needs.
"""
