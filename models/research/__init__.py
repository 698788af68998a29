"""Research-only models and sweeps: the SM (split-merge) and TV (single-stream) reference rerankers, the ZoDIAC and
ACE-RPE attention variants, the ablation runner and the CP shape frontier.

They are trained and evaluated beside the served rerankers (CP and T-EMDE) so that the write-ups in docs/research/
can compare them, and nothing that is served builds them: `crossprobe export` loads a checkpoint without the
references (checkpoint.load(references=False)), the exported graphs are the towers, CP, T-EMDE and the explain
map, and serving runs those graphs on ONNX Runtime without importing this package's modules.
ModelConfig still reads the references' configs, since a checkpoint's config.json (and so its fingerprint)
describes every reranker it was trained with.
"""
