"""Built-in backends: one adapter module per framework, imported only when loaded."""

#: built-in name -> "module:attribute" (the attribute is a class taking no arguments)
BUILTIN = {
    "numpy": "attention_conformance.backends.numpy:NumpyBackend",
    "torch": "attention_conformance.backends.torch:TorchBackend",
    "jax": "attention_conformance.backends.jax:JaxBackend",
    "tensorflow": "attention_conformance.backends.tensorflow:TensorflowBackend",
    "onnxruntime": "attention_conformance.backends.onnxruntime:OnnxruntimeBackend",
    "onnx-reference": "attention_conformance.backends.onnx_reference:OnnxReferenceBackend",
    "paddle": "attention_conformance.backends.paddle:PaddleBackend",
}
