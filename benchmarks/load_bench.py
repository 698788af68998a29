"""Load and soak of POST /v1/search (issue 16 item 6): maximum sustainable searches/s per rerank mode, a closed-loop
throughput run, a soak at a fixed rate, and a py-spy profile under load. Loopback only; every run is bounded in
count and time and stops by itself.

    .venv/bin/python -m benchmarks.load_bench max-qps [--sizes 8091,100000] [--modes cp,temde,none]
    .venv/bin/python -m benchmarks.load_bench closed [--clients 16] [--requests 1500] [--mode cp]
    .venv/bin/python -m benchmarks.load_bench soak [--rate R | --fraction 0.8] [--minutes 10]
    .venv/bin/python -m benchmarks.load_bench profile [--clients 16] [--seconds 20]
        -> docs/research/results/load.json (one section per command, each with its command line, machine and load average)

The indexes, the embedded Redis and the service are benchmarks/harness.py's (prepare, service_env, start_server): the
Flickr8k index (8,091 items) and the 100K one (those items plus noisy copies), `crossprobe serve` in a subprocess
with the shipped defaults except access log off, no reload polling and CROSSPROBE_QUEUE_SIZE=256; `--env K=V`
changes a setting for a comparison. The load comes from loadgen.py (one asyncio process, raw HTTP/1.1 keep-alive).
Run one at a time: each stops the embedded Redis it started when it ends, under any other still running.

max-qps: per (index, mode), offered open-loop rates start at --start and grow by --factor while a step of
--step-s seconds passes (0 errors, 0 degraded answers, p99 <= --p99-ms, answered >= 95% of the offered rate; a failed
step is run once more before it counts, as one spike from another job on a shared machine is not the service's
limit), then one rate halfway between the last pass and the first failure is tried the same way; the answer is the
highest rate that passed.
soak: the open loop at --rate (or --fraction of the last max-qps result for the mode and index) for --minutes:
per-minute p50 / p99 / errors, the server's RSS every 10 s (VmRSS of /proc/<pid>/status).
On a 2-core machine the generator competes with the service; its own CPU use is in every result.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from benchmarks import harness
from benchmarks.loadgen import Generator, Record, Run, search_requests
from crossprobe.storage.redis_conn import close_embedded
from crossprobe.models.evaluation.report import machine as describe
from crossprobe.service.server import free_port

HOST = "127.0.0.1"
OUT = Path("docs/research/results/load.json")


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


TICK = os.sysconf("SC_CLK_TCK")


def busy_s() -> float:
    """CPU seconds the whole machine has been busy (all cores; /proc/stat, idle and iowait excluded)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(f) - f[3] - f[4]) / TICK


def proc_cpu_s(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TICK


class Meter:
    """CPU over a window: the service, this process (the load generator) and everything else on the machine, in
    cores. `others_cores` well above 0 means another job shared the cores: the window's numbers are low."""

    redis_pid: int | None = None  # the embedded redis-server (service() sets it)

    def __init__(self, server_pid: int):
        self.pid = server_pid
        self.t, self.busy, self.srv, self.me = time.monotonic(), busy_s(), proc_cpu_s(server_pid), time.process_time()
        self.rd = proc_cpu_s(self.redis_pid) if self.redis_pid else 0.0

    def read(self) -> dict:
        wall = time.monotonic() - self.t
        busy, srv, me = busy_s() - self.busy, proc_cpu_s(self.pid) - self.srv, time.process_time() - self.me
        rd = proc_cpu_s(self.redis_pid) - self.rd if self.redis_pid else 0.0
        return {"service_cores": round(srv / wall, 2), "redis_cores": round(rd / wall, 2),
                "client_cores": round(me / wall, 2), "others_cores": round(max(0.0, busy - srv - rd - me) / wall, 2)}


def wait_idle(max_wait_s: float, below: float = 0.3, window_s: float = 5.0) -> float:
    """Wait (at most max_wait_s) until the machine is busy less than `below` cores over a window: a shared machine's
    other jobs (tests run without the lock) would otherwise be measured too. -> the last window's busy cores."""
    deadline = time.monotonic() + max_wait_s
    while True:
        b0 = busy_s()
        time.sleep(window_s)
        cores = (busy_s() - b0) / window_s
        if cores < below or time.monotonic() >= deadline:
            return round(cores, 2)
        print(f"machine busy ({cores:.2f} cores used by other jobs): waiting", flush=True)


@contextmanager
def service(args):
    """-> (port, server process, names {size: index}, queries, checkpoint fingerprint); everything stopped after."""
    ixs, redis_client, ckpt, fp, _, names, queries = harness.prepare(args.workdir, args.ckpt, None, args.big)
    names = {s: n for s, n in names.items() if s in args.sizes.split(",")} if args.sizes else names
    Meter.redis_pid = redis_client.pid
    proc = None
    try:
        env = harness.service_env(ixs, redis_client, ckpt, names, args.query_precision, args.threads)
        env.update(kv.split("=", 1) for kv in args.env)
        port = free_port()
        proc = harness.start_server(env, port, args.workdir / "server.log")
        yield port, proc, names, queries, fp
    finally:
        harness.stop_server(proc)
        close_embedded()


def gen(port: int, queries: list[str], mode: str, index: str, timeout_s: float) -> Generator:
    return Generator(HOST, port, search_requests(HOST, port, queries, mode, index), timeout_s)


def step(g: Generator, rate: float, seconds: float, p99_ms: float, pid: int) -> dict:
    # the service is idle between steps: what the machine does now is other jobs; let them pass (bounded)
    waited = time.monotonic()
    wait_idle(90, window_s=2.0)
    waited = round(time.monotonic() - waited - 2.0, 1)
    m = Meter(pid)
    run = asyncio.run(g.open_loop(rate, seconds))
    s = {**run.summary(), **m.read()}
    s["rate"] = round(rate, 1)
    s["waited_for_idle_s"] = waited
    # a degraded answer (rerank skipped: Redis unreachable or slow) is not a sustained search either
    s["pass"] = s["errors"] == 0 and s["degraded"] == 0 and s["p99_ms"] <= p99_ms and s["ok"] >= 0.95 * rate * seconds
    return s


def attempts(g, rate: float, args, pid: int, steps: list, tag: str, note: str = "") -> dict:
    """One open-loop step at `rate`, run once more if it fails (one spike on a shared machine is not a limit);
    every attempt is appended to steps -> the last one."""
    for attempt in (1, 2):
        s = step(g, rate, args.step_s, args.p99_ms, pid)
        s["attempt"] = attempt
        steps.append(s)
        print(f"{tag} {rate:7.1f}/s: answered {s['qps']}/s p50 {s['p50_ms']} p99 {s['p99_ms']} ms, {s['errors']} errors "
              f"{s['error_kinds'] or ''} {s['degraded']} degraded, other jobs {s['others_cores']} cores "
              f"{'pass' if s['pass'] else 'FAIL'}{note}", flush=True)
        time.sleep(1)
        if s["pass"]:
            break
    return s


def max_qps(args, port: int, pid: int, names: dict, queries: list[str]) -> dict:
    out: dict = {}
    for size, index in names.items():
        out[size] = {}
        for mode in args.modes.split(","):
            g = gen(port, queries, mode, index, args.timeout_s)
            asyncio.run(g.closed_loop(4, 100))  # warm-up: connections, caches
            steps, rate, best, fail = [], args.start, None, None
            while rate <= args.max_rate:
                s = attempts(g, rate, args, pid, steps, f"{size:>7} {mode:>5}")
                if not s["pass"]:
                    fail = rate
                    break
                best, rate = s, rate * args.factor
            if best is not None and fail is not None:  # one more between the last pass and the first failure
                mid = (best["rate"] + fail) / 2
                s = attempts(g, mid, args, pid, steps, f"{size:>7} {mode:>5}", " (refine)")
                if s["pass"]:
                    best = s
            g.close()
            out[size][mode] = {"max_qps": best["rate"] if best else None, "at": best, "first_fail": fail,
                               "steps": steps}
            print(f"==> {size} {mode}: max sustainable {best['rate'] if best else None}/s "
                  f"(p99 {best['p99_ms'] if best else '-'} ms)", flush=True)
    return out


def closed(args, port: int, pid: int, names: dict, queries: list[str]) -> dict:
    out: dict = {}
    for size, index in names.items():
        g = gen(port, queries, args.mode, index, args.timeout_s)
        asyncio.run(g.closed_loop(4, 100))
        m = Meter(pid)
        s = {**asyncio.run(g.closed_loop(args.clients, args.requests, args.max_seconds)).summary(), **m.read()}
        g.close()
        print(f"{size} {args.mode} clients={args.clients}: {s}", flush=True)
        out[size] = {**s, "clients": args.clients, "mode": args.mode}
    return out


def minute_cpu(a: Meter, b: Meter) -> dict:
    """Cores used between two snapshots (soak: the service and other jobs, per minute)."""
    wall = b.t - a.t
    srv, busy = b.srv - a.srv, b.busy - a.busy
    rd = (b.rd - a.rd) if a.redis_pid else 0.0
    return {"service_cores": round(srv / wall, 2),
            "others_cores": round(max(0.0, busy - srv - rd - (b.me - a.me)) / wall, 2)}


def soak(args, port: int, proc, names: dict, queries: list[str], previous: dict) -> dict:
    size = next(iter(names))
    index = names[size]
    rate = args.rate
    if rate is None:
        found = previous.get("max-qps", {}).get("results", {}).get(size, {}).get(args.mode, {}).get("max_qps")
        if not found:
            sys.exit(f"no max-qps result for {size}/{args.mode} in {args.out}: run max-qps first or pass --rate")
        rate = round(args.fraction * found, 1)
    g = gen(port, queries, args.mode, index, args.timeout_s)
    asyncio.run(g.closed_loop(4, 200))  # warm-up, then the RSS baseline
    rss = [(0.0, rss_kb(proc.pid))]
    cpu: list[tuple[float, Meter]] = [(0.0, Meter(proc.pid))]  # snapshots every 10 s: CPU per minute below
    seconds = args.minutes * 60
    records: list[Record] = []

    async def main() -> Run:
        loop = asyncio.get_running_loop()
        t0 = loop.time()

        async def sample() -> None:
            while True:
                await asyncio.sleep(10)
                rss.append((round(loop.time() - t0, 1), rss_kb(proc.pid)))
                cpu.append((loop.time() - t0, Meter(proc.pid)))

        sampler = asyncio.create_task(sample())
        try:
            run = await g.open_loop(rate, seconds, sink=records)
        finally:
            sampler.cancel()
        rss.append((round(loop.time() - t0, 1), rss_kb(proc.pid)))
        return run

    meter = Meter(proc.pid)
    run = asyncio.run(main())
    whole_cpu = meter.read()
    g.close()
    t0 = min(r.start for r in records)
    minutes = []
    for m in range(int(np.ceil(seconds / 60))):
        sub = Run([r for r in records if m * 60 <= r.start - t0 < (m + 1) * 60], wall_s=60.0)
        x = sub.summary()
        snaps = [(t, mt) for t, mt in cpu if m * 60 <= t < (m + 1) * 60 + 5]
        used = minute_cpu(snaps[0][1], snaps[-1][1]) if len(snaps) > 1 else {}
        minutes.append({"minute": m + 1, "requests": x["requests"], "errors": x["errors"], "qps": x["qps"],
                        "p50_ms": x["p50_ms"], "p99_ms": x["p99_ms"], "max_ms": x["max_ms"], **used})
        print(f"minute {m + 1}: {minutes[-1]}", flush=True)
    total = run.summary()
    growth = 100.0 * (rss[-1][1] - rss[0][1]) / rss[0][1]
    print(f"soak {rate}/s for {args.minutes} min: {total}; RSS {rss[0][1]} -> {rss[-1][1]} kB ({growth:+.2f}%)")
    return {"index": index, "size": size, "mode": args.mode, "rate": rate, "minutes": args.minutes, "total": total,
            "cpu": whole_cpu,
            "per_minute": minutes, "rss_kb": rss, "rss_start_kb": rss[0][1], "rss_end_kb": rss[-1][1],
            "rss_max_kb": max(v for _, v in rss), "rss_growth_pct": round(growth, 2)}


def profile(args, port: int, proc, names: dict, queries: list[str]) -> dict:
    """py-spy record of the server while `clients` closed-loop clients search; the stacks are summarised by
    profile_table.py (what each sampled thread was doing)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    size = next(iter(names))
    g = gen(port, queries, args.mode, names[size], args.timeout_s)
    asyncio.run(g.closed_loop(4, 100))
    raw = args.workdir / f"profile-{args.label}.txt"
    cmd = [spy, "record", "--pid", str(proc.pid), "--duration", str(args.seconds), "--rate", "200",
           "--format", "raw", "--threads", "--nonblocking", "--output", str(raw)]
    if args.native:
        cmd.append("--native")
    from benchmarks.profile_table import cpu_by_thread, summarise, task_cpu, thread_ids

    spy_proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1)
    cpu0, t0, m = task_cpu(proc.pid), time.monotonic(), Meter(proc.pid)
    s = {**asyncio.run(g.closed_loop(args.clients, 10**9, max_seconds=args.seconds - 2)).summary(), **m.read()}
    cpu1, wall = task_cpu(proc.pid), time.monotonic() - t0
    g.close()
    _, err = spy_proc.communicate(timeout=args.seconds + 60)
    if spy_proc.returncode != 0:
        sys.exit(f"py-spy failed: {err.decode()[-2000:]}")
    text = raw.read_text()
    table = summarise(text)
    table["cpu"] = cpu_by_thread(cpu0, cpu1, thread_ids(text), wall)
    print(json.dumps(table, indent=1))
    print(f"load during the profile: {s}")
    return {"label": args.label, "mode": args.mode, "size": size, "clients": args.clients, "seconds": args.seconds,
            "raw": str(raw), "load": s, "table": table}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["max-qps", "closed", "soak", "profile"])
    ap.add_argument("--sizes", default=None, help="index sizes to load, e.g. 8091 or 8091,100000 (default: all)")
    ap.add_argument("--big", type=int, default=100_000)
    ap.add_argument("--modes", default="cp,temde,none")
    ap.add_argument("--mode", default="cp", help="closed / soak / profile: the rerank mode")
    ap.add_argument("--start", type=float, default=40.0)
    ap.add_argument("--factor", type=float, default=1.15)
    ap.add_argument("--max-rate", type=float, default=600.0)
    ap.add_argument("--step-s", type=float, default=10.0)
    ap.add_argument("--p99-ms", type=float, default=100.0)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=1500)
    ap.add_argument("--max-seconds", type=float, default=120.0)
    ap.add_argument("--rate", type=float, default=None)
    ap.add_argument("--fraction", type=float, default=0.8)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--native", action="store_true", help="profile: py-spy --native (C frames too)")
    ap.add_argument("--label", default="default", help="a name for this configuration in the results")
    ap.add_argument("--timeout-s", type=float, default=10.0, help="one request's deadline")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--query-precision", default="fp32", help="CROSSPROBE_QUERY_PRECISION (the service's default)")
    ap.add_argument("--env", action="append", default=[], help="K=V for the service (repeatable)")
    ap.add_argument("--ckpt", type=Path, default=None)
    ap.add_argument("--workdir", type=Path, default=Path("artifacts/bench-service"))
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--wait-idle-s", type=float, default=300.0,
                    help="first wait up to this long for other jobs to leave the cores (0: do not wait)")
    args = ap.parse_args()
    harness.require_flickr8k()
    if args.what in ("soak", "profile") and not args.sizes:
        args.sizes = "8091"
    command = "python -m benchmarks.load_bench " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    idle_cores = wait_idle(args.wait_idle_s) if args.wait_idle_s else None
    load_avg = os.getloadavg()[0]
    previous = json.loads(args.out.read_text()) if args.out.exists() else {}
    with service(args) as (port, proc, names, queries, fp):
        if args.what == "max-qps":
            res = max_qps(args, port, proc.pid, names, queries)
        elif args.what == "closed":
            res = closed(args, port, proc.pid, names, queries)
        elif args.what == "soak":
            res = soak(args, port, proc, names, queries, previous)
        else:
            res = profile(args, port, proc, names, queries)
    section = {"command": command, "label": args.label, "service_env": args.env,
               "machine": f"{describe()}, load average {load_avg:.2f} at start",
               "busy_cores_before_start": idle_cores,
               "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "model": fp, "results": res}
    key = args.what if args.label == "default" else f"{args.what}:{args.label}"
    previous[key] = section
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(previous, indent=1) + "\n")
    print(f"-> {args.out} [{key}]")


if __name__ == "__main__":
    main()
