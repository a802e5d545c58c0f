"""Built-in backends: one adapter module per framework, imported only when loaded."""

#: built-in name -> "module:attribute" (the attribute is a class taking no arguments)
BUILTIN = {
    "numpy": "attention_conformance.backends.numpy:NumpyBackend",
    "torch": "attention_conformance.backends.torch:TorchBackend",
    "torch-math": "attention_conformance.backends.torch_kernels:TorchMathBackend",
    "torch-flash": "attention_conformance.backends.torch_kernels:TorchFlashBackend",
    "torch-efficient": "attention_conformance.backends.torch_kernels:TorchEfficientBackend",
    "torch-cudnn": "attention_conformance.backends.torch_kernels:TorchCudnnBackend",
    "torch-flex": "attention_conformance.backends.torch_flex:TorchFlexBackend",
    "torch-flex-compiled": "attention_conformance.backends.torch_flex:TorchFlexCompiledBackend",
    "jax": "attention_conformance.backends.jax:JaxBackend",
    "jax-cudnn": "attention_conformance.backends.jax:JaxCudnnBackend",
    "tensorflow": "attention_conformance.backends.tensorflow:TensorflowBackend",
    "onnxruntime": "attention_conformance.backends.onnxruntime:OnnxruntimeBackend",
    "onnx-reference": "attention_conformance.backends.onnx_reference:OnnxReferenceBackend",
    "paddle": "attention_conformance.backends.paddle:PaddleBackend",
    "torch-ring": "attention_conformance.backends.torch_ring:TorchRingBackend",
    "jax-ring": "attention_conformance.backends.jax_ring:JaxRingBackend",
    "jax-ring-processes": "attention_conformance.backends.jax_ring_processes:JaxRingProcessesBackend",
    "transformers-sdpa": "attention_conformance.backends.transformers:TransformersSdpaBackend",
    "transformers-eager": "attention_conformance.backends.transformers:TransformersEagerBackend",
    "transformers-flex": "attention_conformance.backends.transformers:TransformersFlexBackend",
    "keras-torch": "attention_conformance.backends.keras:KerasTorchBackend",
    "keras-tensorflow": "attention_conformance.backends.keras:KerasTensorflowBackend",
    "keras-jax": "attention_conformance.backends.keras:KerasJaxBackend",
    "flax-nnx": "attention_conformance.backends.flax_nnx:FlaxNnxBackend",
    "tinygrad": "attention_conformance.backends.tinygrad:TinygradBackend",
    # GPU only: on a machine without CUDA they load and every test is unsupported
    "flashinfer": "attention_conformance.backends.flashinfer:FlashinferBackend",
    "vllm-flash": "attention_conformance.backends.vllm_flash:VllmFlashBackend",
    "torch-context-parallel":
        "attention_conformance.backends.torch_context_parallel:TorchContextParallelBackend",
}
