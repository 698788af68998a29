"""The circuit breaker's state machine (service/breaker.py) on a fake clock; tests/service/
test_redis_faults.py drives the same code against a real Redis server that is paused and killed."""
from __future__ import annotations

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from crossprobe.service import metrics
from crossprobe.service.breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreaker, FeatureStore, FeatureStoreUnavailable


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_opens_after_n_consecutive_failures_and_a_success_resets_the_count():
    clock, changes = Clock(), []
    b = CircuitBreaker(failures=3, cooldown_s=1.0, clock=clock, on_change=lambda o, n: changes.append((o, n)))
    b.failure("e1")
    b.failure("e2")
    b.success()  # not consecutive any more
    b.failure("e3")
    b.failure("e4")
    assert b.state == CLOSED and b.allow()
    b.failure("e5")
    assert b.state == OPEN and b.last_error == "e5" and changes == [(CLOSED, OPEN)]
    assert not b.allow()


def test_one_timeout_trips_at_once():
    b = CircuitBreaker(failures=3, cooldown_s=1.0, clock=Clock())
    b.failure("timeout", trip=True)
    assert b.state == OPEN and not b.allow()


def test_half_open_lets_one_probe_through_after_the_cooldown():
    clock = Clock()
    b = CircuitBreaker(failures=1, cooldown_s=1.0, clock=clock)
    b.failure("down")
    clock.t += 0.99
    assert not b.allow() and b.state == OPEN
    clock.t += 0.02
    assert b.allow() and b.state == HALF_OPEN  # the probe
    assert not b.allow()  # everyone else still skips while it runs
    b.failure("still down")  # the probe failed: open again, a new cool-down
    assert b.state == OPEN and not b.allow()
    clock.t += 1.01
    assert b.allow()
    b.success()
    assert b.state == CLOSED and b.allow() and b.allow()


def test_a_probe_that_never_reports_is_replaced_after_a_cooldown():
    clock = Clock()
    b = CircuitBreaker(failures=1, cooldown_s=1.0, clock=clock)
    b.failure("down")
    clock.t += 1.5
    assert b.allow()  # this probe's thread dies without reporting
    clock.t += 0.5
    assert not b.allow()
    clock.t += 0.6
    assert b.allow()


def test_failures_while_open_restart_the_cooldown():
    """The background PING keeps failing while Redis stays down: requests never become the probe."""
    clock = Clock()
    b = CircuitBreaker(failures=1, cooldown_s=1.0, clock=clock)
    b.failure("down")
    for _ in range(5):
        clock.t += 0.5
        b.failure("ping failed")
        assert not b.allow()
    opened = b.changed_at
    assert clock.t - opened == pytest.approx(2.5)  # health reports how long it has been open, not the last ping


def _raise(exc):
    def fn(*_):
        raise exc
    return fn


def _count(metric, *labels) -> float:
    return metric.labels(*labels)._value.get()


def test_feature_store_counts_classifies_and_skips():
    clock = Clock()
    fs = FeatureStore(failures=2, cooldown_s=1.0, clock=clock)
    assert fs.call("fetch", lambda x: x + 1, 1) == 2
    errs, skipped, opened = (_count(metrics.FEATURE_STORE_ERRORS, "connection"),
                             _count(metrics.FEATURE_STORE_SKIPPED, "fetch"),
                             _count(metrics.FEATURE_STORE_TRANSITIONS, "open"))
    # an error reply means Redis answered: it propagates unchanged and counts as a success
    with pytest.raises(ResponseError):
        fs.call("fetch", _raise(ResponseError("WRONGTYPE")))
    with pytest.raises(KeyError):
        fs.call("fetch", _raise(KeyError("gone")))
    assert fs.up
    for _ in range(2):
        with pytest.raises(FeatureStoreUnavailable, match="unreachable"):
            fs.call("fetch", _raise(RedisConnectionError("refused")))
    assert not fs.up and metrics.FEATURE_STORE_UP._value.get() == 0
    assert _count(metrics.FEATURE_STORE_ERRORS, "connection") == errs + 2
    assert _count(metrics.FEATURE_STORE_TRANSITIONS, "open") == opened + 1
    called = []
    with pytest.raises(FeatureStoreUnavailable, match="circuit open"):
        fs.call("fetch", called.append, 1)
    assert called == [] and _count(metrics.FEATURE_STORE_SKIPPED, "fetch") == skipped + 1
    assert fs.retry_after_s == 1
    h = fs.health()
    assert h["up"] is False and h["state"] == OPEN and "refused" in h["last_error"]
    # the background PING closes it whatever the cool-down
    assert fs.probe(lambda: True) and fs.up and metrics.FEATURE_STORE_UP._value.get() == 1


def test_feature_store_timeout_trips_and_failed_ping_opens():
    fs = FeatureStore(failures=3, cooldown_s=2.5, clock=Clock())
    with pytest.raises(FeatureStoreUnavailable, match="timed out"):
        fs.call("metadata", _raise(RedisTimeoutError("Timeout reading from socket")))
    assert not fs.up and fs.retry_after_s == 3
    fs.probe(lambda: True)
    assert fs.up
    assert not fs.probe(_raise(RedisConnectionError("refused"))) and fs.up  # one refused PING: counted, not open
    assert not fs.probe(_raise(RedisTimeoutError("paused"))) and not fs.up  # a timed-out PING: open
