"""Keeps this node's UltraServer labels (listed in the README) equal to what discovery says.

Schedulers and the controller select UltraServer nodes by these labels. :mod:`.labelplan`
decides (pure) the merge patch that sets or removes only the labels we own;
:class:`NodeLabeller` applies it whenever the inventory changes or someone edits the Node.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from neuron_dra.common.k8s.client import NODES, KubeClient
from neuron_dra.common.k8s.clock import Clock, SystemClock
from neuron_dra.common.k8s.reflector import Reflector
from neuron_dra.common.k8s.workqueue import QueueMetrics, RateLimiter
from neuron_dra.nodeplugin.discovery.model import NodeInventory
from neuron_dra.nodeplugin.publish.labelplan import node_label_patch, ultraserver_node_labels
from neuron_dra.nodeplugin.publish.metrics import PublisherMetrics
from neuron_dra.nodeplugin.publish.syncworker import SyncWorker, log_failure

log = logging.getLogger(__name__)

InventoryProvider = Callable[[], NodeInventory | None]


class NodeLabeller:
    """Keeps the UltraServer labels on this node equal to the inventory's.

    A merge patch of ``metadata.labels`` touches only the keys it names, so no resourceVersion
    guard is needed: other writers' labels cannot be lost, and the labels we name are ours.
    Until discovery has run (inventory None) nothing is changed, so a restart does not strip
    labels that schedulers rely on and then put them back.
    """

    def __init__(
        self,
        kube: KubeClient,
        *,
        node_name: str,
        inventory: InventoryProvider,
        clock: Clock | None = None,
        rate_limiter: RateLimiter[str] | None = None,
        metrics: PublisherMetrics | None = None,
        queue_metrics: QueueMetrics | None = None,
    ) -> None:
        self.node_name = node_name
        self._inventory = inventory
        self._api = kube.resource(NODES)
        self._metrics = metrics or PublisherMetrics()
        self._worker = SyncWorker(
            f"node-labeller-{node_name}",
            self.sync,
            self._on_error,
            clock=clock or SystemClock(),
            rate_limiter=rate_limiter,
            queue_metrics=queue_metrics,
        )
        self.patches = 0
        self.last_error: Exception | None = None

    def start(self) -> None:
        self._worker.start()
        self._worker.request()

    async def stop(self) -> None:
        await self._worker.stop()

    def request_sync(self) -> None:
        self._worker.request()

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        await self._worker.wait_until(predicate)

    def watch_node(self, reflector: Reflector) -> None:
        """Re-check whenever the Node changes (someone removed or edited our labels).

        Register before the reflector starts, e.g. with the publisher's ``node_reflector``.
        """
        reflector.add_handler(on_add=self._on_node, on_update=lambda _o, new: self._on_node(new))

    def _on_node(self, node: dict[str, Any]) -> None:
        if (node.get("metadata") or {}).get("name") != self.node_name:
            return
        inventory = self._inventory()
        if inventory is None:
            return
        labels = (node.get("metadata") or {}).get("labels") or {}
        if node_label_patch(labels, ultraserver_node_labels(inventory)):
            self.request_sync()

    async def sync(self) -> dict[str, str | None]:
        """Patch the Node's labels if needed; returns the patch applied ({} if none)."""
        inventory = self._inventory()
        if inventory is None:
            return {}
        node = await self._api.get(self.node_name)
        labels = (node.get("metadata") or {}).get("labels") or {}
        patch = node_label_patch(labels, ultraserver_node_labels(inventory))
        if not patch:
            return {}
        await self._api.merge_patch(self.node_name, {"metadata": {"labels": patch}})
        self.patches += 1
        self.last_error = None
        self._metrics.label_patches.inc()
        log.info("Node labels updated: %s", patch, extra={"node": self.node_name})
        return patch

    def _on_error(self, exc: Exception) -> None:
        self.last_error = exc
        self._metrics.label_errors.labels(type(exc).__name__).inc()
        log_failure(f"labelling node {self.node_name}", exc, self._worker.failures)
