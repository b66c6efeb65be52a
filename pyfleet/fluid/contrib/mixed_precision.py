"""``fluid.contrib.mixed_precision``: importable, and its ``decorate`` refused
(float16 training is a GPU feature; pyfleet runs on CPU in float32; compact
sparse rows are pyfleet's own ``storage`` option, see docs/storage.md)."""

from pyfleet.errors import ConfigError

__all__ = ["AutoMixedPrecisionLists", "decorate"]

_WHY = ("automatic mixed precision is a GPU feature and pyfleet runs on CPU in float32 "
        "(for smaller sparse rows use a table's fp16/bf16 storage)")


def decorate(optimizer, amp_lists=None, init_loss_scaling=1.0, incr_every_n_steps=1000,
             decr_every_n_nan_or_inf=2, incr_ratio=2.0, decr_ratio=0.8,
             use_dynamic_loss_scaling=True):
    """Refused: see the module doc."""
    raise ConfigError(f"fluid.contrib.mixed_precision.decorate is not supported: {_WHY}")


class AutoMixedPrecisionLists:
    """Refused: see the module doc."""

    def __init__(self, custom_white_list=None, custom_black_list=None):
        raise ConfigError("fluid.contrib.mixed_precision.AutoMixedPrecisionLists is not "
                          f"supported: {_WHY}")
