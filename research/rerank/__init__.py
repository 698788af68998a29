"""Reranker recipes, fusion and stacking: research/rerank/README.md."""
