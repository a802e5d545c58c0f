"""Known bug: an fp8 output scale applied as a multiply: the output written as
out * o_scale where the spec's o_scale (FlashInfer's MLA wrapper's: real = quantized *
o_scale) divides, as a kernel whose epilogue reads it as the factor applied to O
(FlashInfer's cute-dsl decode documents its o_scale so) would write it."""

from _plant import Planted


class OutputScaleMultiplied(Planted):
    """Output scale multiplied: the fp8 output is out * o_scale, not out / o_scale."""

    def sdpa(self, q, k, v, *, o_scale=None, **params):
        return super().sdpa(q, k, v, o_scale=None if o_scale is None else 1.0 / o_scale,
                            **params)
