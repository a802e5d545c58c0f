"""Known bug: the fp8 output scale ignored: the attention cast to the fp8 output format
as it is, never divided by o_scale (a fused attention + quantization whose bmm2_scale
was not divided by the output scale)."""

from _plant import Planted


class OutputScaleIgnored(Planted):
    """Output scale ignored: the fp8 output is the attention cast as is, not out / o_scale."""

    def sdpa(self, q, k, v, *, o_scale=None, **params):
        return super().sdpa(q, k, v, o_scale=None if o_scale is None else 1.0, **params)
