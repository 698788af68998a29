"""The queue layer alone (no models): bounded batches, bounded waits, errors, admission."""
from __future__ import annotations

import asyncio
import os
import time

import pytest

from crossprobe.service.batcher import Limiter, Overloaded, QueryBatcher


def _run(coro):
    return asyncio.run(coro)


class FakeTower:
    def __init__(self, delay: float = 0.0, fail: bool = False):
        self.batches: list[list[str]] = []
        self.delay, self.fail = delay, fail

    def __call__(self, texts: list[str]) -> list[str]:
        self.batches.append(list(texts))
        time.sleep(self.delay)
        if self.fail:
            raise RuntimeError("tower down")
        return [t.upper() for t in texts]


async def _submit_all(b: QueryBatcher, texts: list[str]):
    b.start()
    try:
        return await asyncio.gather(*(b.submit(t) for t in texts))
    finally:
        await b.stop()


def test_concurrent_queries_share_bounded_batches():
    tower = FakeTower()
    out = _run(_submit_all(QueryBatcher(tower, batch_max=4, batch_wait_s=0.05), [f"q{i}" for i in range(10)]))
    assert [q for q, _ in out] == [f"Q{i}" for i in range(10)]  # each caller gets its own row back
    assert [len(b) for b in tower.batches] == [4, 4, 2] and max(info.batch_size for _, info in out) == 4
    assert all(info.queue_ms >= 0 and info.encode_ms >= 0 for _, info in out)


def test_a_lone_query_waits_at_most_batch_wait():
    tower = FakeTower()
    t = time.perf_counter()
    _run(_submit_all(QueryBatcher(tower, batch_max=16, batch_wait_s=0.05), ["alone"]))
    assert tower.batches == [["alone"]] and time.perf_counter() - t < 1.0


def test_batching_off_runs_one_query_at_a_time():
    tower = FakeTower()
    _run(_submit_all(QueryBatcher(tower, batch_max=16, batch_wait_s=0.5, enabled=False), ["a", "b", "c"]))
    assert tower.batches == [["a"], ["b"], ["c"]]


def test_encoder_errors_reach_every_caller_and_the_batcher_survives():
    tower = FakeTower(fail=True)

    async def go():
        b = QueryBatcher(tower, batch_max=4, batch_wait_s=0.01)
        b.start()
        try:
            res = await asyncio.gather(b.submit("x"), b.submit("y"), return_exceptions=True)
            tower.fail = False
            return res, await b.submit("z")
        finally:
            await b.stop()

    res, after = _run(go())
    assert all(isinstance(r, RuntimeError) for r in res) and after[0] == "Z"


def test_limiter_refuses_past_its_size():
    lim = Limiter(2)
    with lim.admit(), lim.admit():
        with pytest.raises(Overloaded):
            with lim.admit():
                pass
        assert lim.in_flight == 2
    assert lim.in_flight == 0
    with lim.admit():
        assert lim.in_flight == 1


def test_a_lone_query_in_a_quiet_service_does_not_wait():
    tower = FakeTower()
    t = time.perf_counter()
    _run(_submit_all(QueryBatcher(tower, batch_max=16, batch_wait_s=2.0, busy=lambda n: False), ["alone"]))
    assert tower.batches == [["alone"]] and time.perf_counter() - t < 1.0  # not the 2 s batch_wait


class CountingTower(FakeTower):
    """Records how many batches run at the same moment."""

    def __init__(self, delay: float):
        super().__init__(delay)
        import threading

        self.lock, self.now, self.most = threading.Lock(), 0, 0

    def __call__(self, texts):
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            return super().__call__(texts)
        finally:
            with self.lock:
                self.now -= 1


@pytest.mark.parametrize("encoders", [1, 2, 3])
def test_encoders_bound_how_many_batches_run_at_once(encoders):
    """CROSSPROBE_QUERY_ENCODERS: up to that many batches run side by side (a slow tower, one query per batch),
    never more; every caller still gets its own answer."""
    tower = CountingTower(delay=0.05)
    b = QueryBatcher(tower, batch_max=1, batch_wait_s=0.0, encoders=encoders)
    out = _run(_submit_all(b, [f"q{i}" for i in range(8)]))
    assert sorted(q for q, _ in out) == sorted(f"Q{i}" for i in range(8))
    assert tower.most == encoders, (tower.most, encoders)


def test_profiles_follow_the_model_and_settings_override_them(tmp_path):
    """The measured profile by model (service/profiles.py): crossprobe's own tower one spinning shared-pool thread;
    a family model two threads on pools that do not spin; what the settings set wins."""
    from crossprobe.service.settings import Settings

    own = Settings().profile
    assert (own.threads, own.shared_pool, own.spinning, own.encoders) == (1, True, True, 1)
    fam = Settings(model=f"hf:{tmp_path}").profile
    assert (fam.shared_pool, fam.spinning, fam.encoders) == (False, False, 1) and fam.threads == min(2, os.cpu_count())
    set_ = Settings(model=f"hf:{tmp_path}", threads=3, ort_shared_pool=True, query_encoders=2).profile
    assert (set_.threads, set_.shared_pool, set_.encoders) == (3, True, 2)
