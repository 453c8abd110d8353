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
    """kombu's Redis QoS whose restore, acknowledgement and rejection of messages never run on a closed connection.

    A task that was running when the connection was lost ends after the worker has reconnected on a new channel;
    its acknowledgement then goes to the old channel, whose transport is gone, and the same ``_connparams``
    AttributeError would end the worker. Such a message stays in Redis' unacked hash instead, and is delivered
    again after the visibility timeout (every task is idempotent, so running it twice does no harm).
    """

    def _connection_gone(self) -> bool:
        transport = self.channel.connection
        return transport is None or transport.client is None

    def restore_unacked(self, client=None):
        if client is None and self._connection_gone():
            log.warning("broker connection lost with %d unacknowledged message(s): left for the visibility "
                        "timeout to deliver again", len(self._delivered))
            return None
        return super().restore_unacked(client)

    def ack(self, delivery_tag):
        if self._connection_gone():
            log.warning("acknowledgement of message %s on a lost broker connection: left for the visibility "
                        "timeout to deliver again", delivery_tag)
            self._quick_ack(delivery_tag)  # forget it here only; Redis keeps it for redelivery
            return None
        return super().ack(delivery_tag)

    def reject(self, delivery_tag, requeue=False):
        if self._connection_gone():
            log.warning("rejection of message %s on a lost broker connection: left for the visibility timeout "
                        "to deliver again", delivery_tag)
            self._quick_ack(delivery_tag)  # forget it here only; Redis keeps it for redelivery
            return None
        return super().reject(delivery_tag, requeue=requeue)


class Channel(kombu_redis.Channel):
    """kombu's Redis channel with ``QoS`` above."""

    QoS = QoS


class RedisTransport(kombu_redis.Transport):
    """kombu's Redis transport with ``Channel`` above; same URLs, options and behaviour otherwise."""

    Channel = Channel
