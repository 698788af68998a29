"""Query-tower latency on 2 CPU cores: ONNX Runtime fp32 at 1 / 2 / default threads vs
dynamic int8 quantization, one typical caption, median of 200; plus how far int8 moves g_q.
Needs artifacts/service/<fingerprint>/query_tower.onnx (written by `crossprobe serve` or `make demo`).

Measured 2026-11-22 (2 cores): fp32 default 5.2 ms, 1 thread 8.4, 2 threads 5.4; int8 default 2.4 ms,
1 thread 3.0; cosine(g_q fp32, g_q int8) = 0.969 -- too far to switch without re-measuring R@1.
"""
import time, glob, numpy as np, onnxruntime as ort, statistics
from crossprobe.models import backbones as bb
p = glob.glob('artifacts/service/*/query_tower.onnx')[0]
tok = bb.load_tokenizer()
ids, mask = bb.tokenize(tok, ["a black dog is running through the grass with a ball in its mouth"])
def bench(sess, n=200):
    for _ in range(10): sess.run(None, {"input_ids": ids, "attention_mask": mask})
    ts=[]
    for _ in range(n):
        t=time.perf_counter(); sess.run(None, {"input_ids": ids, "attention_mask": mask}); ts.append((time.perf_counter()-t)*1000)
    return round(statistics.median(ts),3)
for th in (None, 1, 2):
    o = ort.SessionOptions(); o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if th: o.intra_op_num_threads = th
    print('threads', th, bench(ort.InferenceSession(p, o, providers=['CPUExecutionProvider'])))
from onnxruntime.quantization import quantize_dynamic, QuantType
quantize_dynamic(p, '/tmp/qt_int8.onnx', weight_type=QuantType.QInt8)
for th in (None, 1):
    o = ort.SessionOptions()
    if th: o.intra_op_num_threads = th
    s=ort.InferenceSession('/tmp/qt_int8.onnx', o, providers=['CPUExecutionProvider'])
    print('int8 threads', th, bench(s))
a=ort.InferenceSession(p, providers=['CPUExecutionProvider']).run(None, {"input_ids": ids, "attention_mask": mask})[0]
b=s.run(None, {"input_ids": ids, "attention_mask": mask})[0]
print('cos g_q fp32 vs int8', float((a*b).sum()/np.linalg.norm(a)/np.linalg.norm(b)))
