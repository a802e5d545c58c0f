"""Built-in backends: one adapter module per framework, imported only when loaded."""

#: built-in name -> "module:attribute" (the attribute is a class taking no arguments)
BUILTIN = {
    "numpy": "backends.numpy:NumpyBackend",
    "torch": "backends.torch:TorchBackend",
    "torch-math": "backends.torch_kernels:TorchMathBackend",
    "torch-flash": "backends.torch_kernels:TorchFlashBackend",
    "torch-efficient": "backends.torch_kernels:TorchEfficientBackend",
    "torch-cudnn": "backends.torch_kernels:TorchCudnnBackend",
    "torch-flex": "backends.torch_flex:TorchFlexBackend",
    "torch-flex-compiled": "backends.torch_flex:TorchFlexCompiledBackend",
    "jax": "backends.jax:JaxBackend",
    "jax-cudnn": "backends.jax:JaxCudnnBackend",
    "tensorflow": "backends.tensorflow:TensorflowBackend",
}
