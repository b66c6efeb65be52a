"""The server's counters, written in Prometheus' text exposition format (0.0.4).

Kept by the event loop's thread only (no lock): requests by status code,
request latency and micro-batch sizes as histograms, rows predicted, the model
version served, swaps and refused versions, rows of each table in RAM and on
disk. Written without a client library: the format is a few lines of text.
"""

import bisect

__all__ = ["Histogram", "ServeMetrics"]

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 16384, 65536)


def _label(value):
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(**kv):
    return "{" + ",".join(f'{k}="{_label(v)}"' for k, v in kv.items()) + "}" if kv else ""


class Histogram:
    """Cumulative buckets, a sum and a count, as Prometheus histograms are."""

    def __init__(self, bounds):
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value):
        self.counts[bisect.bisect_left(self.bounds, value)] += 1  # the first bound >= value
        self.sum += value

    def lines(self, name):
        out, total = [], 0
        for bound, c in zip(self.bounds + ("+Inf",), self.counts):
            total += c
            out.append(f'{name}_bucket{{le="{bound}"}} {total}')
        out += [f"{name}_sum {self.sum!r}", f"{name}_count {total}"]
        return out


class ServeMetrics:
    def __init__(self):
        self.requests = {}          # status code -> count
        self.errors = {}            # reason (the refusal's kind) -> count
        self.latency = Histogram(LATENCY_BUCKETS)
        self.batch_rows = Histogram(BATCH_BUCKETS)
        self.rows = 0
        self.swaps = 0
        self.load_failures = 0
        self.in_flight = 0

    def request(self, status, seconds, error_kind=None, timed=True):
        self.requests[status] = self.requests.get(status, 0) + 1
        if status >= 400:
            kind = error_kind or str(status)
            self.errors[kind] = self.errors.get(kind, 0) + 1
        if timed:  # prediction requests only: /healthz and /metrics would hide them
            self.latency.observe(seconds)

    def _merged(self, native):
        """A copy of these counters with the native front end's added."""
        got = native.front.metrics()
        m = ServeMetrics()
        m.rows, m.swaps, m.load_failures = self.rows + native.rows, self.swaps, \
            self.load_failures
        m.in_flight = native.front.in_flight()
        for mine, theirs, into in ((self.requests, got["requests"], m.requests),
                                   (self.errors, got["errors"], m.errors)):
            for k in set(mine) | set(theirs):
                into[k] = mine.get(k, 0) + theirs.get(k, 0)
        m.latency.counts = [a + b for a, b in zip(self.latency.counts, got["latency_counts"])]
        m.latency.sum = self.latency.sum + got["latency_sum"]
        m.batch_rows.counts = [a + b for a, b in zip(self.batch_rows.counts,
                                                     native.batch_rows.counts)]
        m.batch_rows.sum = self.batch_rows.sum + native.batch_rows.sum
        return m

    def render(self, version, table_stats, native=None):
        """The text of ``GET /metrics``; ``version``: the served ModelVersion or None;
        ``table_stats``: ``{table: (rows in RAM, rows on disk)}``; ``native``: the
        native front end (:class:`pyfleet.serving.native.NativeFront`), whose
        counts are added to these."""
        if native is not None:
            return self._merged(native).render(version, table_stats)
        p = "pyfleet_serve_"
        out = [f"# HELP {p}requests_total Requests answered, by HTTP status code.",
               f"# TYPE {p}requests_total counter"]
        out += [f"{p}requests_total{_labels(code=c)} {n}" for c, n in sorted(self.requests.items())]
        out += [f"# HELP {p}errors_total Requests refused or failed, by kind.",
                f"# TYPE {p}errors_total counter"]
        out += [f"{p}errors_total{_labels(kind=k)} {n}" for k, n in sorted(self.errors.items())]
        out += [f"# HELP {p}request_duration_seconds Time from a prediction request's "
                f"arrival to its answer.", f"# TYPE {p}request_duration_seconds histogram"]
        out += self.latency.lines(f"{p}request_duration_seconds")
        out += [f"# HELP {p}batch_rows Rows of each model step (requests gathered into one).",
                f"# TYPE {p}batch_rows histogram"]
        out += self.batch_rows.lines(f"{p}batch_rows")
        out += [f"# HELP {p}rows_total Rows predicted.", f"# TYPE {p}rows_total counter",
                f"{p}rows_total {self.rows}",
                f"# HELP {p}in_flight_requests Requests being answered now.",
                f"# TYPE {p}in_flight_requests gauge", f"{p}in_flight_requests {self.in_flight}",
                f"# HELP {p}model_swaps_total Model versions swapped in after the first.",
                f"# TYPE {p}model_swaps_total counter", f"{p}model_swaps_total {self.swaps}",
                f"# HELP {p}model_load_failures_total Model versions refused (damaged, "
                f"incomplete or unreadable).", f"# TYPE {p}model_load_failures_total counter",
                f"{p}model_load_failures_total {self.load_failures}",
                f"# HELP {p}model_info The model version served (value 1).",
                f"# TYPE {p}model_info gauge"]
        if version is not None:
            out.append(f"{p}model_info{_labels(version=version.name, digest=version.digest)} 1")
        out += [f"# HELP {p}table_rows Rows of each sparse table, in RAM or on disk.",
                f"# TYPE {p}table_rows gauge"]
        for table, (ram, disk) in sorted(table_stats.items()):
            out.append(f"{p}table_rows{_labels(table=table, tier='ram')} {ram}")
            out.append(f"{p}table_rows{_labels(table=table, tier='disk')} {disk}")
        return "\n".join(out) + "\n"
