"""Redis Cluster: the client, and the two calls of the request path that must fail fast (fetch, ping).

Cluster mode (CROSSPROBE_REDIS_CLUSTER=1, REDIS_URL = the startup nodes, comma separated) uses
redis-py's RedisCluster for everything: routing by slot, MOVED / ASK, topology refresh, the
cluster pipeline that groups commands by node. The indexer (a batch job) uses it as it is: a
pipeline that meets a failover re-sends the failed commands until the replica is promoted, which
is what a build wants.

The service must not wait for a failover. redis-py's cluster pipeline (and so mget_nonatomic)
re-sends every command of a node that timed out ONE AT A TIME, each waiting its own socket
timeout, and refreshes the topology after each, so one call lasts until the replica is promoted:
measured on the local cluster (cluster-node-timeout 1 s, socket timeout 200 ms), one mget_nonatomic of
100 keys blocked 2.0 s while a master was paused (docs/research/results/redis_cluster.json, failover), and the
promotion itself waits for cluster-node-timeout (Redis' default: 15 s). fetch() below
sends the same per-slot MGETs, grouped per master by redis-py's own slot table and over redis-py's
own node clients and connection pools (every master's MGETs written before any reply is read, as
redis-py's pipeline does: one round trip per master, overlapped), but gives up at the first node that
does not answer: the caller (the service's circuit breaker, service/breaker.py) degrades the search
at once, and the topology is refreshed so that the next call after the failover reaches the
promoted replica. Redirections (MOVED / ASK: a resharding, or a table that went stale while
the old master answers again) are left to redis-py's mget_nonatomic, which follows them.
"""

from __future__ import annotations

import logging
from typing import TypeGuard

from redis import Redis
from redis.cluster import ClusterNode, RedisCluster
from redis.connection import Connection
from redis.crc import key_slot
from redis.exceptions import AskError, ClusterDownError, MovedError, ResponseError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from crossprobe.storage.settings import redact_url, redis_url_parts, split_url

log = logging.getLogger("crossprobe.indexer")


class ClusterUnavailable(RedisConnectionError):
    """A node answered but cannot serve the slot now (CLUSTERDOWN while a failover runs, TRYAGAIN).
    A ConnectionError, so the service's breaker counts it like a node that does not answer."""


def is_cluster(r: object) -> TypeGuard[RedisCluster]:
    return isinstance(r, RedisCluster)


def startup_nodes(url: str) -> tuple[str, list[ClusterNode]]:
    """REDIS_URL in cluster mode: 'redis://h1:p1,redis://h2:p2' or 'redis://h1:p1,h2:p2' -> (the first
    URL, which carries credentials / TLS for every node, the other nodes)."""
    parts = redis_url_parts(url)
    if not parts:
        raise ValueError("REDIS_URL is empty; cluster mode needs at least one node (redis://host:port)")
    first, rest = parts[0], []
    for p in parts[1:]:
        u = split_url(p)
        if not u.hostname or not u.port:
            raise ValueError(f"REDIS_URL node {redact_url(p)!r}: expected redis://host:port or host:port")
        rest.append(ClusterNode(u.hostname, u.port))
    return first, rest


def connect_cluster(url: str, opts: dict) -> RedisCluster:
    """A RedisCluster client with the same socket timeouts, credentials, TLS files and connection class as a
    single-Redis client (opts: redis_conn's client_options and url_options). Its `retry`
    (cluster level: re-route after a refresh) gets the configured count; node clients never retry
    (redis-py's rule). health_check_interval is not a cluster option (redis-py drops it)."""
    first, rest = startup_nodes(url)
    retry = opts["retry"]
    kw = {k: v for k, v in opts.items() if k not in ("retry", "retry_on_error", "health_check_interval")}
    return RedisCluster(url=first, startup_nodes=rest, retry=retry, decode_responses=False, **kw)


def _by_node(rc: RedisCluster, keys: list) -> list[tuple[ClusterNode, list[list]]]:
    """keys -> [(master, [keys of one slot, ...])], by redis-py's current slot table."""
    slots: dict[int, list] = {}
    for k in keys:
        slots.setdefault(key_slot(rc.encoder.encode(k)), []).append(k)
    nodes: dict[str, tuple[ClusterNode, list[list]]] = {}
    for slot, ks in slots.items():
        node = rc.nodes_manager.get_node_from_slot(slot)
        nodes.setdefault(node.name, (node, []))[1].append(ks)
    return list(nodes.values())


def fetch(rc: RedisCluster, keys: list) -> list[bytes | None]:
    """The values of keys (None where missing), in order: one MGET per slot, the MGETs of each master in one
    packet, written to every master before any reply is read (as redis-py's cluster pipeline does): one round
    trip per master, overlapped. A master that does not answer within the socket timeout fails the whole call
    (after a slot table refresh): never a wait for the failover."""
    plan = _by_node(rc, keys)
    sent: list[tuple[ClusterNode, Redis, Connection, list[list]]] = []  # node, its client, connection, key groups
    clean = set()  # connections whose replies were all read (the others are dropped: a late reply must not
    got: dict = {}  # reach the next user of the connection)
    failed = None
    try:
        for node, groups in plan:
            failed = node
            client = rc.get_redis_connection(node)
            conn = client.connection_pool.get_connection()
            sent.append((node, client, conn, groups))
            conn.send_packed_command(conn.pack_commands([("MGET", *ks) for ks in groups]))
        for node, client, conn, groups in sent:
            failed = node
            replies = []
            for _ in groups:
                try:
                    replies.append(client.parse_response(conn, "MGET"))
                except ResponseError as e:  # an error reply (MOVED, CLUSTERDOWN...): the next ones still come
                    replies.append(e)
            clean.add(id(conn))
            for ks, rep in zip(groups, replies):
                if isinstance(rep, (MovedError, AskError)):  # slots moved: redis-py follows the redirections
                    failed = None
                    try:
                        return rc.mget_nonatomic(keys)
                    except (ClusterDownError, TryAgainError) as e:  # the failover is still settling
                        raise ClusterUnavailable(f"{node.name}: {e}") from e
                if isinstance(rep, (ClusterDownError, TryAgainError)):
                    raise ClusterUnavailable(f"{node.name}: {rep}") from rep
                if isinstance(rep, Exception):
                    failed = None
                    raise rep
                got.update(zip(ks, rep))
        failed = None
    except (RedisConnectionError, RedisTimeoutError) as e:
        if failed is not None:
            refresh(rc, failed, e)
        raise
    finally:
        for _, client, conn, _ in sent:
            if id(conn) not in clean:
                conn.disconnect()
            client.connection_pool.release(conn)
    return [got[k] for k in keys]


def ping(rc: RedisCluster) -> bool:
    """PING every master of the current slot table (the service's background health check): True when all
    answer; else refresh the table (a promoted replica is found on the next ping) and raise."""
    for node in rc.get_primaries():
        try:
            rc.get_redis_connection(node).ping()
        except (RedisConnectionError, RedisTimeoutError) as e:
            refresh(rc, node, e)
            raise
    return True


def refresh(rc: RedisCluster, failed: ClusterNode, why: Exception) -> None:
    """Re-read the slot table from the other nodes first (the failed one last). Errors are swallowed:
    the caller raises its own, and a cluster that cannot answer now is asked again on the next call."""
    log.info("redis cluster: %s failed (%s: %s); refreshing the slot table", failed.name, type(why).__name__, why)
    try:
        rc.nodes_manager.move_node_to_end_of_cached_nodes(failed.name)
        rc.nodes_manager.initialize(last_failed_node_name=failed.name)
    except Exception as e:  # noqa: BLE001 - RedisClusterException ("cannot connect to any node") is no RedisError
        log.info("redis cluster: slot table refresh failed: %s", e)
