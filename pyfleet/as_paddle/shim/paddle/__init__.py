"""Zero-edit mode's ``paddle``: importing it makes ``paddle`` (and every
``paddle.*``) pyfleet in this interpreter (:mod:`pyfleet.as_paddle`). This
directory is on PYTHONPATH only under ``pyfleet run`` or ``pyfleet.launch
--paddle``; ``import paddle`` returns the ``pyfleet`` module itself."""

try:
    from pyfleet.as_paddle import activate
except ImportError as exc:
    import sys
    raise ImportError(f"zero-edit mode (pyfleet run / pyfleet.launch --paddle) makes "
                      f"`paddle` pyfleet, but this interpreter ({sys.executable}) cannot "
                      f"import pyfleet: {exc}") from exc

activate()
