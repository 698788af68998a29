"""Does the Milvus server we run (PyPI's `milvus` wheel, 2.3.5) have full-text (BM25) search? (issue 31, item 2)

    python -m research.text_search.milvus_bm25
        prints the server's version, then either a BM25 search's answer or the server's refusal

It starts the local server (benchmarks/support/local_milvus.py), creates a collection whose VARCHAR field feeds a
BM25 function into a sparse vector field (pymilvus 3's Function API, Milvus 2.5's schema), inserts two texts and
searches one word, then stops the server.
"""
from __future__ import annotations

import tempfile
from pathlib import Path


def main() -> None:
    from pymilvus import DataType, Function, FunctionType, MilvusClient

    from benchmarks.support.local_milvus import LocalMilvus

    server = LocalMilvus(Path(tempfile.mkdtemp(prefix="bm25-probe-"))).start()
    try:
        server.wait_ready()
        client = MilvusClient(uri=server.uri, timeout=30)
        print("server version:", client.get_server_version())
        schema = MilvusClient.create_schema()
        schema.add_field("id", DataType.INT64, is_primary=True)
        schema.add_field("text", DataType.VARCHAR, max_length=1000, enable_analyzer=True)
        schema.add_field("sparse", DataType.SPARSE_FLOAT_VECTOR)
        schema.add_function(Function(name="bm25", function_type=FunctionType.BM25, input_field_names=["text"],
                                     output_field_names=["sparse"]))
        index = client.prepare_index_params()
        index.add_index(field_name="sparse", index_type="SPARSE_INVERTED_INDEX", metric_type="BM25")
        try:
            client.create_collection("bm25probe", schema=schema, index_params=index)
            client.insert("bm25probe", [{"id": 1, "text": "a bakery sign"}, {"id": 2, "text": "post office"}])
            print("BM25 search:", client.search("bm25probe", data=["bakery"], anns_field="sparse", limit=2,
                                                search_params={"metric_type": "BM25"}))
        except Exception as e:  # noqa: BLE001 - the refusal is the answer
            print("BM25 refused:", type(e).__name__, str(e)[:400])
    finally:
        server.kill()


if __name__ == "__main__":
    main()
