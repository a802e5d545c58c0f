"""Built-in backends: one adapter module per framework, imported only when loaded."""

#: built-in name -> "module:attribute" (the attribute is a class taking no arguments)
BUILTIN = {
    "numpy": "backends.numpy:NumpyBackend",
    "torch": "backends.torch:TorchBackend",
    "jax": "backends.jax:JaxBackend",
    "tensorflow": "backends.tensorflow:TensorflowBackend",
    "onnxruntime": "backends.onnxruntime:OnnxruntimeBackend",
    "onnx-reference": "backends.onnx_reference:OnnxReferenceBackend",
    "paddle": "backends.paddle:PaddleBackend",
}
