"""The request path as named, timed stages:

  queue -> encode -> ann -> fetch -> rerank -> metadata
  (batcher)  (query    (FAISS on   (ONE MGET of   (cp_scorer or     (MGET of the
             tower)     the pinned  the shortlist's temde_scorer,     final k)
                        version)    feature values) one run over K)

  plan.py      Plan: what one search runs, built from the request model in one call (Plan.from_request)
  searcher.py  Searcher: resolve -> encode -> the stages after encode, in a worker thread
  stages.py    one function per stage after encode (filter_rows, ann, keyword, fetch, rerank, order,
               relevance, cutoffs, dedup, sort, page, metadata, highlight, facets: AFTER_ENCODE)
  run.py       Run: one request's state, handed from stage to stage; the Outcome it answers

What is searched for: a text (the query tower's g_q), an image (decode_image -> encode_image:
the indexer's backbone + image tower, so the query vector is a g_I as the index stores them), the stored
vectors of indexed items ("like": their mean, renormalised, read from the version's vectors.npy; stage
like), or a raw vector (clip-retrieval's embedding_input). With a text and a vector together the ANN query
is (1 - w) g_q + w v, renormalised (w: the request's weight, default 0.5), and the rerankers run with the
text's probes and this combined cosine as their two-tower score. Without a text nothing can rerank: the
ANN order is the answer (rerank "none", said in the response with the reason). Items given as "like" are
never among the results. dedup: results whose stored vectors have a cosine >= the threshold with a result
ranked above them are dropped (clip-retrieval's deduplicate; stage dedup).

Relevance: a text query's results carry a calibrated relevance, the probability that each matches
(core/calibration.py, per rerank mode); min_relevance drops the results below it, so a query for something
the index does not hold can return nothing.

Pages: everything above is the whole ranked answer (the shortlist, less the filter's, "like"'s, min_score's,
min_relevance's and dedup's drops); `sort` may reorder it by date taken or added (stage sort, from the version's
metadata columns);
its length is the answer's total, and the page is its [offset, offset + k) slice, so every page of the same
request comes from the same ranking (the shortlist does not grow with the offset). Metadata is read for the
page only.

The handle (one index version) is taken once per request, so every stage reads
the same version even if a new one goes live meanwhile. The two-tower score the
rerankers fuse with, s_tt = g_q . g_I, is the FAISS inner product itself (exact
for Flat and HNSW, which store full vectors; approximate under IVF-PQ).

Failures that are not the client's fault degrade instead of failing: if the
feature fetch fails the shortlist keeps its ANN order; if metadata cannot be
read the results come without it. The response then says degraded: true and why
(Outcome.degraded: (code, message) pairs, stages.py). Both Redis calls go through the
feature store's circuit breaker (breaker.py): while Redis is down they are skipped
at once (code feature_store_unavailable), or, with CROSSPROBE_REDIS_DOWN_SEARCH=fail,
the search answers 503 feature_store_unavailable.
"""

from crossprobe.service.pipeline.plan import Plan
from crossprobe.service.pipeline.run import Outcome, RankedItem
from crossprobe.service.pipeline.searcher import Searcher
from crossprobe.service.pipeline.stages import public_metadata

__all__ = ["Outcome", "Plan", "RankedItem", "Searcher", "public_metadata"]
