"""A circuit breaker around the feature store (Redis), so a dead or paused Redis costs a search nothing.

Why: with redis-py's defaults every call to a dead Redis waits seconds and every
call to a paused one hangs until it wakes up, holding a stage thread each; searches queued behind
them. Short socket timeouts and a bounded retry (storage/redis_conn.py) bound ONE call
to ~250 ms; the breaker makes the calls after the first failures skip at once:

    closed ──(N consecutive failures, or one timeout)──> open ──(cool-down)──> half-open
      ^                                                   ^                       │
      └──────────── a call (or the background PING) succeeds ─────────────────────┤
                                                          └──── the probe fails ──┘

  closed     calls go to Redis; connection failures are counted, a timeout trips at once (a
             paused Redis would cost every following call the whole timeout).
  open       calls raise FeatureStoreUnavailable at once (searches answer from the ANN stage,
             flagged degraded; item routes answer 503). After `cooldown_s` the next call is let
             through as the probe (half-open); the service's background PING (FeatureStore.probe,
             every CROSSPROBE_REDIS_PROBE_INTERVAL_S) closes the breaker too, so recovery does
             not wait for traffic, and opens it when Redis dies while no request is running.
  half-open  one call at a time tries Redis: success closes, failure re-opens (a new cool-down).

A failure reported while open (a failed background PING, a call that started before the breaker
opened) restarts the cool-down: while Redis stays down and the PING runs more often than the
cool-down, no search is ever the probe; only the PING pays the timeout.

Only availability errors count (redis ConnectionError, which includes BusyLoadingError, and
TimeoutError): a missing key or a WRONGTYPE reply means Redis answered, so it counts as a success.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from crossprobe.service import metrics

T = TypeVar("T")

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


class FeatureStoreUnavailable(RedisConnectionError):
    """Redis cannot be used now: the breaker is open, or this call failed to reach it.
    A redis ConnectionError, so code that already handles Redis failures handles this one too."""


class CircuitBreaker:
    """The state machine alone (thread-safe; no Redis, no metrics: FeatureStore adds those)."""

    def __init__(
        self,
        failures: int = 3,
        cooldown_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[str, str], None] | None = None,
    ):
        self.failures, self.cooldown_s, self.clock, self.on_change = failures, cooldown_s, clock, on_change
        self.state = CLOSED
        self.changed_at = clock()  # when the state last changed (health detail)
        self._cooldown_from = self.changed_at  # open: the cool-down runs from here (the last failure)
        self.last_error: str | None = None
        self._count = 0  # consecutive failures while closed
        self._probe_since: float | None = None  # half-open: when the probing call was let through
        self._lock = threading.Lock()

    def allow(self) -> bool:
        """May a call go to Redis now? (open: no; half-open: only the one probe)"""
        with self._lock:
            if self.state == CLOSED:
                return True
            now = self.clock()
            if self.state == OPEN:
                if now - self._cooldown_from < self.cooldown_s:
                    return False
                change = self._set(HALF_OPEN, now)
            else:
                change = None
            # one probe at a time; a probe that never reported (its thread died) is replaced after a cool-down
            if self._probe_since is not None and now - self._probe_since < self.cooldown_s:
                allowed = False
            else:
                self._probe_since, allowed = now, True
        self._notify(change)
        return allowed

    def success(self) -> None:
        with self._lock:
            self._count, self._probe_since = 0, None
            change = self._set(CLOSED, self.clock()) if self.state != CLOSED else None
        self._notify(change)

    def failure(self, error: str, trip: bool = False) -> None:
        """A call could not reach Redis. trip: open now whatever the count (a timeout)."""
        with self._lock:
            self.last_error, self._probe_since = error, None
            self._count += 1
            change = None
            if self.state == CLOSED:
                if trip or self._count >= self.failures:
                    change = self._set(OPEN, self.clock())
            elif self.state == HALF_OPEN:
                change = self._set(OPEN, self.clock())
            else:  # already open: a late failure (or a failed background PING) restarts the cool-down
                self._cooldown_from = self.clock()
        self._notify(change)

    def _set(self, state: str, now: float) -> tuple[str, str]:
        old, self.state, self.changed_at, self._cooldown_from = self.state, state, now, now
        if state == CLOSED:
            self._count = 0
        return old, state

    def _notify(self, change: tuple[str, str] | None) -> None:
        if change and self.on_change:  # outside the lock: callbacks log and count
            self.on_change(*change)


class FeatureStore:
    """Every Redis call of the service goes through call(); probe() is the background health check."""

    def __init__(
        self,
        failures: int = 3,
        cooldown_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        log: logging.Logger | None = None,
    ):
        self.breaker = CircuitBreaker(failures, cooldown_s, clock, on_change=self._changed)
        self.clock, self.log = clock, log  # log: state changes (None: silent)
        metrics.FEATURE_STORE_UP.set(1)

    @property
    def up(self) -> bool:
        return self.breaker.state == CLOSED

    @property
    def retry_after_s(self) -> int:
        """Retry-After for a 503 while Redis is down: the cool-down, at least 1 s."""
        return max(1, int(-(-self.breaker.cooldown_s // 1)))

    def call(self, op: str, fn: Callable[..., T], *args) -> T:
        """fn(*args), unless the breaker is open -> FeatureStoreUnavailable at once. op labels the metrics
        (fetch | metadata | item | ...)."""
        b = self.breaker
        if not b.allow():
            metrics.FEATURE_STORE_SKIPPED.labels(op).inc()
            since = self.clock() - b.changed_at
            raise FeatureStoreUnavailable(
                f"feature store (Redis) unavailable: circuit {b.state} for {since:.1f} s (last error: {b.last_error})"
            )
        return self._run(op, fn, *args)

    def probe(self, ping: Callable[[], object]) -> bool:
        """One PING whatever the breaker's state: closes it when Redis answers, opens it when it does not."""
        try:
            self._run("ping", ping)
        except FeatureStoreUnavailable:
            return False
        return True

    def _run(self, op: str, fn: Callable[..., T], *args) -> T:
        try:
            out = fn(*args)
        except RedisTimeoutError as e:  # paused / overloaded: every later call would wait as long, trip now
            self._failed(op, "timeout", e, trip=True)
            raise FeatureStoreUnavailable(f"feature store (Redis) timed out: {e}") from e
        except RedisConnectionError as e:
            if isinstance(e, FeatureStoreUnavailable):
                raise
            self._failed(op, "connection", e, trip=False)
            raise FeatureStoreUnavailable(f"feature store (Redis) unreachable: {type(e).__name__}: {e}") from e
        except Exception:
            self.breaker.success()  # Redis answered (missing keys, a bad value...): it is up; the caller handles it
            raise
        self.breaker.success()
        return out

    def _failed(self, op: str, kind: str, e: Exception, trip: bool) -> None:
        metrics.FEATURE_STORE_ERRORS.labels(kind).inc()
        self.breaker.failure(f"{type(e).__name__}: {e}", trip=trip)

    def health(self) -> dict:
        b = self.breaker
        return {
            "up": self.up,
            "state": b.state,
            "for_s": round(self.clock() - b.changed_at, 3),
            "last_error": b.last_error,
        }

    def _changed(self, old: str, new: str) -> None:
        metrics.FEATURE_STORE_TRANSITIONS.labels(new).inc()
        metrics.FEATURE_STORE_UP.set(1 if new == CLOSED else 0)
        if self.log is not None:
            level = self.log.info if new == CLOSED else self.log.warning
            level(
                "feature store (Redis): circuit %s -> %s%s",
                old,
                new,
                f" ({self.breaker.last_error})" if new != CLOSED else "",
            )
