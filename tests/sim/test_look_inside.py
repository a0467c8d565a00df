"""Reading what a real container has (``kubectl exec`` of the look-inside script): an exec
cut off by a node rebooting under it exits 0 with what was printed so far, which must not
read as a container without its environment (a soak on real nodes once reported
``NEURON_RT_VISIBLE_CORES=None`` for a container looked into 0.4 s after its node's reboot)."""

from __future__ import annotations

import base64

import pytest
from neuron_dra.sim.simcluster.realnodes import _LOOK_END, LookCutShort, parse_look_inside

METADATA = "/var/run/kubernetes.io/dra-device-attributes/claim.json"
METADATA_B64 = base64.b64encode(b'{"a": 1}').decode()
COMPLETE = "\n".join(
    [
        "DEVICE /dev/neuron10",
        "DEVICE /dev/neuron2",
        f"FILE {METADATA} {METADATA_B64}",
        "PATH=/bin",
        "NEURON_RT_VISIBLE_CORES=0-15",
        _LOOK_END,
        "",
    ]
)


def test_a_complete_look_gives_devices_files_and_env() -> None:
    seen = parse_look_inside(COMPLETE)
    assert seen.device_nodes == ["/dev/neuron2", "/dev/neuron10"]
    assert seen.files == {METADATA: '{"a": 1}'}
    assert seen.env == {"PATH": "/bin", "NEURON_RT_VISIBLE_CORES": "0-15"}


@pytest.mark.parametrize("cut", [0, 1, 2, 3, 5])
def test_a_look_cut_short_is_refused_not_read(cut: int) -> None:
    output = "\n".join(COMPLETE.splitlines()[:cut])
    with pytest.raises(LookCutShort, match=f"cut short after {cut} lines"):
        parse_look_inside(output)
