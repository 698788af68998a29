"""What the benchmarks and the tests both start or build, and the product never runs: a local Redis Cluster
(local_cluster.py), a Milvus server in a virtualenv of its own (local_milvus.py), and a library grown with generated
items (synthetic.py). Here, under benchmarks/, because the tests already import benchmarks/ (loadgen, library_files)
and nothing under benchmarks/ imports tests/: one direction, no circle."""
