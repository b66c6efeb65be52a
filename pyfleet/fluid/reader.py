"""``batch(reader, batch_size)``: Paddle's ``paddle.batch``."""

__all__ = ["batch"]


def batch(reader, batch_size, drop_last=False):
    """A reader creator yielding lists of ``batch_size`` samples from
    ``reader()`` (the last, shorter list too unless ``drop_last``)."""
    batch_size = int(batch_size)
    if batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size}")

    def batch_reader():
        b = []
        for sample in reader():
            b.append(sample)
            if len(b) == batch_size:
                yield b
                b = []
        if b and not drop_last:
            yield b

    return batch_reader
