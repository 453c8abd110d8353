"""The Redis transport of the platform's Celery: kombu's, with the one fix that lets a worker outlive its broker.

When the connection to Redis is lost while a worker holds unacknowledged messages (``acks_late`` tasks
running or prefetched), kombu 5.7's consumer closes the connection and its channel; the channel's QoS then
restores those messages through the connection, whose transport has already dropped its client, and
``_connparams`` raises ``AttributeError: 'NoneType' object has no attribute 'hostname'`` (from
``restore_unacked_once``). Celery treats that as an unrecoverable error and the worker exits
(reproduced by ``tests/controlplane/test_worker_outlives_the_broker.py``).

``QoS.restore_unacked`` here leaves the messages where they are when the transport has no client any more:
they stay in Redis' unacked hash, and kombu's own ``restore_visible`` (run by every consumer) puts them back
in their queues after the visibility timeout (``CELERY_VISIBILITY_TIMEOUT_SECONDS``). Redis is unreachable
at that moment anyway, so an immediate restore could not have succeeded. Selected with
``CELERY_BROKER_TRANSPORT = "controlplane.broker:RedisTransport"`` for ``redis://`` URLs.
"""

from __future__ import annotations

import logging

from kombu.transport import redis as kombu_redis

log = logging.getLogger(__name__)


class QoS(kombu_redis.QoS):
    """kombu's Redis QoS whose restore of unacknowledged messages never runs on a closed connection."""

    def restore_unacked(self, client=None):
        transport = self.channel.connection
        if client is None and (transport is None or transport.client is None):
            log.warning("broker connection lost with %d unacknowledged message(s): left for the visibility "
                        "timeout to deliver again", len(self._delivered))
            return None
        return super().restore_unacked(client)


class Channel(kombu_redis.Channel):
    """kombu's Redis channel with ``QoS`` above."""

    QoS = QoS


class RedisTransport(kombu_redis.Transport):
    """kombu's Redis transport with ``Channel`` above; same URLs, options and behaviour otherwise."""

    Channel = Channel
