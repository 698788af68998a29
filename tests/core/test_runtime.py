"""core/runtime.py: sessions on a pool of their own or on the process-wide shared pool.

The shared pool is process-wide and permanent (ONNX Runtime allows it once per process), so
each case runs in a fresh interpreter."""
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

from crossprobe.models import export as ex
from crossprobe.models import graphs


def run_fresh(tmp_path: Path, body: str) -> str:
    """Run `body` in a new interpreter -> its stdout."""
    script = tmp_path / "case.py"
    script.write_text(textwrap.dedent(body))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_shared_pool_gives_the_same_scores_as_own_pools(small_model, tmp_path):
    paths = ex.export_all(small_model, tmp_path, "test", names=("cp_scorer",))
    inputs = graphs.example_inputs(small_model, K=37)["cp_scorer"]
    names = graphs.io_names(small_model, "cp_scorer")[0]
    np.savez(tmp_path / "in.npz", **{k: v.numpy() for k, v in zip(names, inputs)})
    out = run_fresh(tmp_path, f"""
        import numpy as np
        from crossprobe.core import runtime
        feed = dict(np.load({str(tmp_path / 'in.npz')!r}))
        own = runtime.session({str(paths['cp_scorer'])!r}, threads=1, spinning=False).run(None, feed)[0]
        assert runtime.shared_pool_threads() is None
        assert runtime.share_thread_pool(2) == 2
        assert runtime.share_thread_pool(1) == 2  # once per process: the first size stays
        s = runtime.session({str(paths['cp_scorer'])!r}, threads=1, spinning=False)  # own-pool options ignored
        shared = s.run(None, feed)[0]
        assert not s.get_session_options().use_per_session_threads
        print(float(np.abs(own - shared).max()), own.shape[0])
    """)
    diff, k = out.split()
    assert int(k) == 37 and float(diff) <= 1e-5


def test_stage_timer_sums_repeats_across_threads():
    import threading
    import time

    from crossprobe.core.runtime import StageTimer

    timer = StageTimer()

    def work():
        for _ in range(5):
            with timer.stage("decode"):
                time.sleep(0.002)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    timer.add("encode", 0.5)
    seconds = timer.seconds()
    assert list(seconds) == ["decode", "encode"] and seconds["encode"] == 0.5
    assert seconds["decode"] >= 20 * 0.002  # 20 stages of at least 2 ms each, summed
    assert timer.ms()["encode"] == 500.0
