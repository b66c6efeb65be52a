"""Fluid 1.5's ``paddle.fluid.incubate.data_generator``: pipe scripts for Dataset.

A user subclasses :class:`MultiSlotDataGenerator`, implements
``generate_sample(line)`` returning a generator of samples, each a list of
``(slot_name, [values])`` pairs, and calls ``run_from_stdin()``. Every
sample becomes one line of the MultiSlot text format that
:class:`pyfleet.fluid.dataset.QueueDataset` parses: for each slot in order,
the number of values then the values, separated by spaces.
"""

import sys

__all__ = ["DataGenerator", "MultiSlotDataGenerator", "MultiSlotStringDataGenerator"]


class DataGenerator:
    """Base class: ``generate_sample`` (required), ``generate_batch`` (optional)."""

    def __init__(self):
        self.batch_size_ = 32
        self._proto_info = None

    def set_batch(self, batch_size):
        self.batch_size_ = int(batch_size)

    def generate_sample(self, line):
        raise NotImplementedError("implement generate_sample(line) returning a generator")

    def generate_batch(self, samples):
        def local_iter():
            yield from samples
        return local_iter

    def _gen_str(self, line):
        raise NotImplementedError

    def _emit(self, lines, out):
        batch = []
        for line in lines:
            for sample in self.generate_sample(line)():
                if sample is None:
                    continue
                batch.append(sample)
                if len(batch) == self.batch_size_:
                    for s in self.generate_batch(batch)():
                        out.write(self._gen_str(s))
                    batch = []
        if batch:
            for s in self.generate_batch(batch)():
                out.write(self._gen_str(s))

    def run_from_stdin(self):
        """Read raw lines from stdin, write MultiSlot lines to stdout."""
        self._emit(sys.stdin, sys.stdout)
        sys.stdout.flush()

    def run_from_memory(self):
        """Samples from ``generate_sample(None)``, written to stdout."""
        self._emit([None], sys.stdout)
        sys.stdout.flush()


class MultiSlotDataGenerator(DataGenerator):
    """Numeric slots: ``[("dense", [0.1, 0.2]), ("C1", [123]), ("label", [1])]``."""

    def _gen_str(self, line):
        if isinstance(line, (str, bytes)) or not hasattr(line, "__iter__"):
            raise ValueError(f"a sample must be a list of (name, values) pairs, got {line!r}")
        line = list(line)   # Fluid's examples yield zip objects
        parts = []
        names = []
        for item in line:
            if not isinstance(item, (list, tuple)) or len(item) != 2:
                raise ValueError(f"a slot must be a (name, values) pair, got {item!r}")
            name, values = item
            values = list(values)
            if not values:
                raise ValueError(f"slot {name!r} has no values: give at least one "
                                 "(Fluid's rule; use a padding id for a missing value)")
            names.append(name)
            parts.append(str(len(values)))
            parts.extend(str(v) for v in values)
        if self._proto_info is None:
            self._proto_info = names
        elif names != self._proto_info:
            raise ValueError(f"slot names {names} differ from the first sample's "
                             f"{self._proto_info}")
        return " ".join(parts) + "\n"


class MultiSlotStringDataGenerator(MultiSlotDataGenerator):
    """Values written as given (already strings)."""
