"""Statistics of a backend's output, for the `statistic` expectation of a case."""

from __future__ import annotations

import numpy as np

STATISTICS = {}


def statistic(func):
    STATISTICS[func.__name__] = func
    return func


def _output(ctx, name):
    return ctx.outputs[name or next(iter(ctx.outputs))]


@statistic
def std(ctx, output=None):
    """Standard deviation over every entry."""
    return float(np.std(_output(ctx, output)))


@statistic
def mean(ctx, output=None):
    return float(np.mean(_output(ctx, output)))


@statistic
def mean_row_entropy(ctx, output=None):
    """Mean entropy (nats) of the weight rows: log(Lk) is uniform, 0 is one-hot."""
    p = _output(ctx, output)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, -p * np.log(p), 0.0)
    return float(np.mean(np.sum(terms, axis=-1)))


@statistic
def mean_row_max(ctx, output=None):
    """Mean of each weight row's largest weight: near 1 when the softmax saturates."""
    return float(np.mean(np.max(_output(ctx, output), axis=-1)))


@statistic
def rms(ctx, output=None):
    """Root mean square over every entry (a gradient's typical size)."""
    return float(np.sqrt(np.mean(np.square(_output(ctx, output)))))
