"""The walkthrough's step for seeds 003 and 004 (the scheduler extension docs): an invalid
device count refused at Prepare, and check-claim saying so before anything is scheduled."""

from __future__ import annotations

import io

from neuron_dra.sim.commands.check_claim.allocation import check
from neuron_dra.sim.commands.check_claim.inputs import claim_docs
from neuron_dra.sim.commands.check_claim.output import render_text
from neuron_dra.sim.commands.check_claim.sources import Cluster
from neuron_dra.sim.commands.walkthrough.tools import WalkthroughTools, expect


class InvalidCountSteps(WalkthroughTools):
    """The step of seeds 003 and 004 (7 devices on trn1.32xlarge)."""

    async def invalid_count(self) -> None:
        await self.apply_spec("invalid-trn1-7-devices.yaml")
        await self.create_pod("trn1-seven", "trn1-7-devices")
        (event,) = await self.sim.wait_until(
            lambda: self.sim.events("trn1-seven", "FailedPrepareDynamicResources")[:1],
            "FailedPrepareDynamicResources",
        )
        pod = self.sim.pod("trn1-seven") or {}
        self.table(
            ("POD", "NODE", "PHASE", "EVENT"),
            [
                (
                    "trn1-seven",
                    pod["spec"].get("nodeName"),
                    pod["status"].get("phase"),
                    f"Warning {event['reason']}",
                )
            ],
        )
        self.say("    " + event["note"])
        self.say()
        expect(
            "does not support requests for device: 7" in event["note"],
            f"the seed's message, got {event['note']!r}",
        )
        expect(pod["status"].get("phase") == "Pending", "the pod does not start")
        self.say(
            "  neuron-dra check-claim -f examples/specs/invalid-trn1-7-devices.yaml "
            "--kubeconfig <sim>   (says so before anything is scheduled)"
        )
        cluster = Cluster(
            self.sim.slices(),
            {
                x["metadata"]["name"]: x
                for x in self.sim.view.list("resource.k8s.io/v1", "DeviceClass")
            },
            set(),
            source="the simulated cluster",
        )
        (doc,) = claim_docs(self.spec("invalid-trn1-7-devices.yaml"), "invalid-trn1-7-devices.yaml")
        buf = io.StringIO()
        report = check(doc, cluster)
        render_text(report, buf)
        for line in buf.getvalue().splitlines():
            self.say("    " + line)
        self.say()
        expect(
            not any(n.fits for n in report.nodes if n.node.startswith("trn1")),
            "check-claim refuses 7 devices on trn1.32xlarge",
        )
        await self.delete_pods(["trn1-seven"])
