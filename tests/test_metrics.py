"""The REST request metrics, counted as plain integers, against
prometheus-client's own Counter and Histogram (what they replaced)."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from rankd.metrics import LATENCY_BUCKETS, Metrics

OPERATIONS = st.sampled_from(["submit", "top", "member", "unmatched", "submit_batch"])
STATUSES = st.sampled_from([200, 201, 204, 400, 404, 409, 422, 429, 500, 503])
SECONDS = st.one_of(st.sampled_from([0.0, *LATENCY_BUCKETS, 1e-9, 7.5]),
                    st.floats(min_value=0.0, max_value=10.0, allow_nan=False))
#: ``_created`` samples carry the time of a series' first observation: they
#: differ between the two by construction.
CREATED = re.compile(r"^\S+_created\{.*$", re.MULTILINE)


def reference(observations: list[tuple[str, int, float]]) -> str:
    registry = CollectorRegistry()
    requests = Counter("rankd_http_requests", "REST requests by operation and status",
                       ["operation", "status"], registry=registry)
    latency = Histogram("rankd_http_request_seconds", "REST request latency", ["operation"],
                        registry=registry, buckets=LATENCY_BUCKETS)
    for operation, status, seconds in observations:
        requests.labels(operation, str(status)).inc()
        latency.labels(operation).observe(seconds)
    return generate_latest(registry).decode()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(OPERATIONS, STATUSES, SECONDS), max_size=60))
def test_request_metrics_render_as_prometheus_client_would(
        observations: list[tuple[str, int, float]]) -> None:
    metrics = Metrics()
    for observation in observations:
        metrics.observe_request(*observation)
    ours, theirs = metrics.render().decode(), reference(observations)
    assert sorted(CREATED.sub("", ours).splitlines()) == sorted(
        CREATED.sub("", theirs).splitlines())
    assert sorted(line.split(" ")[0] for line in CREATED.findall(ours)) == sorted(
        line.split(" ")[0] for line in CREATED.findall(theirs))
