"""A small base for the configuration records (optimizers, initializers, entries).

A record is a validated bag of JSON-friendly fields: ``params()`` gives them,
``to_config()`` adds the class name (the wire and manifest form), and equality
and ``repr`` follow the fields.
"""

__all__ = ["ConfigRecord", "from_config"]


class ConfigRecord:
    def params(self):
        """The fields as a JSON-friendly dict."""
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}

    def to_config(self):
        """``{"type": <class name>, **params}``."""
        return {"type": type(self).__name__, **self.params()}

    def __eq__(self, other):
        return type(self) is type(other) and self.params() == other.params()

    def __hash__(self):
        return hash((type(self).__name__, tuple(sorted(self.params().items()))))

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"


def from_config(config, classes, what):
    """Rebuild a record from ``to_config()`` output, choosing among ``classes``."""
    config = dict(config)
    name = config.pop("type", None)
    by_name = {c.__name__: c for c in classes}
    if name not in by_name:
        raise ValueError(f"unknown {what} type {name!r}; expected one of {sorted(by_name)}")
    return by_name[name](**config)
