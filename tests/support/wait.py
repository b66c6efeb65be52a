"""Waiting on an event, the one way the tests wait.

A test never sleeps for a guessed time and then asserts: it names the event it
expects (a log line, a file, a counter, a process state) and polls for it here,
with a bounded deadline after which the wait fails naming what never came.
"""

import logging
import os
import time


def wait_until(condition, timeout, what, interval=0.02, detail=None):
    """Poll ``condition()`` until it returns something truthy, and return that.

    After ``timeout`` seconds raise ``AssertionError`` naming ``what`` (and the
    text of ``detail()`` when given, e.g. a log). ``condition`` may itself raise
    to end the wait early (say, when the process it watches has died)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            message = f"timed out after {timeout} s waiting for {what}"
            if detail is not None:
                message += "\n" + str(detail())
            raise AssertionError(message)
        time.sleep(interval)


def file_text(path):
    """The text of ``path``, or ``""`` while it does not exist yet."""
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def wait_for_text(path, text, timeout, what=None, alive=None):
    """Wait until the file ``path`` contains ``text``; its whole text.

    ``alive``, a ``subprocess.Popen``, ends the wait with an ``AssertionError`` as soon
    as that process has exited (the text can no longer come)."""
    def seen():
        if alive is not None and alive.poll() is not None:
            raise AssertionError(f"the process exited ({alive.returncode}) before "
                                 f"{what or repr(text)} appeared in {os.fspath(path)}")
        content = file_text(path)
        return content if text in content else None
    return wait_until(seen, timeout, what or f"{text!r} in {os.fspath(path)}",
                      detail=lambda: file_text(path)[-3000:])


class LogWatch(logging.Handler):
    """The messages a logger of this process emits while the ``with`` block runs, to
    wait on one of them (``watch.wait_for("sending it again", 30)``)."""

    def __init__(self, logger, level=logging.INFO):
        super().__init__(level)
        self.logger = logging.getLogger(logger) if isinstance(logger, str) else logger
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())

    def wait_for(self, text, timeout):
        """Wait until a message containing ``text`` was logged; that message."""
        return wait_until(lambda: next((m for m in list(self.messages) if text in m), None),
                          timeout, f"a {self.logger.name} message with {text!r}",
                          detail=lambda: "\n".join(self.messages[-20:]))

    def __enter__(self):
        self._old_level = self.logger.level
        if self.logger.getEffectiveLevel() > self.level:
            self.logger.setLevel(self.level)
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc):
        self.logger.removeHandler(self)
        self.logger.setLevel(self._old_level)


def wait_for_counter(client, name, at_least, timeout=120, server=0):
    """Wait until counter ``name`` of parameter server ``server`` (read by
    ``client``'s STATS request) reaches ``at_least``; its value."""
    def value():
        n = client.stats()[server]["counters"].get(name, 0)
        return n if n >= at_least else None
    return wait_until(value, timeout, f"{name} >= {at_least} at server {server}",
                      interval=0.05, detail=lambda: client.stats()[server]["counters"])
