"""Instance-type profiles and the connected-set rules (README, "Connected devices")."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from neuron_dra.common.profiles import (
    PROFILES,
    InstanceProfile,
    Topology,
    UnknownInstanceType,
    connected_groups,
    connected_set_error,
    coordinates,
    group_index,
    group_sizes,
    is_connected_set,
    profile_for,
    torus_neighbours,
)

TORUS_TYPES = ["trn1.32xlarge", "trn1n.32xlarge", "trn2.48xlarge", "trn2u.48xlarge"]
REQUIRED_TYPES = [
    "inf1.xlarge", "inf1.2xlarge", "inf1.6xlarge", "inf1.24xlarge",
    "inf2.xlarge", "inf2.8xlarge", "inf2.24xlarge", "inf2.48xlarge",
    "trn1.2xlarge", "trn1.32xlarge", "trn1n.32xlarge",
    "trn2.3xlarge", "trn2.48xlarge", "trn2n.48xlarge", "trn2u.48xlarge",
    "trn3.48xlarge", "trn3p.48xlarge",
]  # fmt: skip

profiles = st.sampled_from(sorted(PROFILES.values(), key=lambda p: p.name))


@pytest.mark.parametrize("name", REQUIRED_TYPES)
def test_required_types_covered(name: str) -> None:
    assert profile_for(name).name == name


def test_error_message_exact() -> None:
    assert connected_set_error(PROFILES["trn1.32xlarge"], 7) == (
        "Instance type trn1.32xlarge does not support requests for device: 7. "
        "Please request a different number of devices."
    )


@pytest.mark.parametrize("name", TORUS_TYPES)
def test_torus_groups_are_rows_and_halves(name: str) -> None:
    p = PROFILES[name]
    assert p.valid_set_sizes == (1, 4, 8, 16)
    assert connected_groups(p, 4) == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15)]
    assert connected_groups(p, 8) == [tuple(range(8)), tuple(range(8, 16))]
    assert connected_groups(p, 16) == [tuple(range(16))]
    assert connected_groups(p, 2) == []
    assert group_sizes(p) == (1, 4, 8, 16)


def test_torus_rejects_documented_unsupported_sets() -> None:
    p = PROFILES["trn1.32xlarge"]
    assert not is_connected_set(p, [1, 2])
    assert not is_connected_set(p, [9, 10, 13, 14])  # a 2x2 square is not a row
    assert not is_connected_set(p, [4, 5, 6, 7, 8, 9, 10, 11])  # rows 1-2 are not a half
    assert is_connected_set(p, [7, 4, 6, 5])
    assert is_connected_set(p, [9])
    assert is_connected_set(p, range(16))


def test_torus_coordinates_and_group_index() -> None:
    p = PROFILES["trn2.48xlarge"]
    assert coordinates(p, 0) == (0, 0)
    assert coordinates(p, 6) == (1, 2)
    assert coordinates(p, 15) == (3, 3)
    assert [group_index(p, d, 4) for d in (0, 5, 11, 12)] == [0, 1, 2, 3]
    assert [group_index(p, d, 8) for d in (7, 8)] == [0, 1]
    with pytest.raises(ValueError, match="not a torus"):
        coordinates(PROFILES["inf2.48xlarge"], 0)


def test_torus_neighbours_match_neuron_ls() -> None:
    # neuron-ls on trn2: device 0 links to 12, 3, 4, 1 and device 5 to 1, 4, 9, 6.
    assert torus_neighbours(4, 4, 0) == {12, 3, 4, 1}
    assert torus_neighbours(4, 4, 5) == {1, 4, 9, 6}


def test_ring_contiguity_with_wraparound() -> None:
    p = PROFILES["inf2.48xlarge"]
    assert is_connected_set(p, [0, 1, 2])
    assert is_connected_set(p, [11, 0, 1])
    assert not is_connected_set(p, [0, 2, 4])
    assert not is_connected_set(p, [0, 1, 3, 4])
    assert p.valid_set_sizes == tuple(range(1, 13))
    assert group_sizes(p) == (1, 2, 3, 4, 6, 12)
    assert connected_groups(p, 5) == []  # contiguous 5s are valid but have no aligned group


def test_single_device_types() -> None:
    p = PROFILES["trn1.2xlarge"]
    assert p.topology is Topology.SINGLE
    assert p.valid_set_sizes == (1,)
    assert connected_groups(p, 1) == [(0,)]


def test_switch_allows_any_subset() -> None:
    p = PROFILES["trn3p.48xlarge"]
    assert is_connected_set(p, [0, 5, 9])
    assert group_sizes(p) == (1, 2, 4, 8, 16)


def test_bad_ids_are_programming_errors() -> None:
    p = PROFILES["trn2.48xlarge"]
    with pytest.raises(ValueError, match="duplicate"):
        is_connected_set(p, [1, 1])
    with pytest.raises(ValueError, match="out of range"):
        is_connected_set(p, [16])
    assert not is_connected_set(p, [])


def test_lnc() -> None:
    trn2 = PROFILES["trn2.48xlarge"]
    assert (trn2.default_lnc, trn2.allowed_lnc) == (2, frozenset({1, 2}))
    assert trn2.logical_cores_per_device() == 4
    assert trn2.logical_cores_per_device(1) == 8
    inf2 = PROFILES["inf2.48xlarge"]
    assert (inf2.default_lnc, inf2.allowed_lnc) == (1, frozenset({1}))
    with pytest.raises(ValueError, match=r"logicalNeuronCore 2 is not supported on inf2\.48xlarge"):
        inf2.logical_cores_per_device(2)


def test_ultraserver_capability() -> None:
    assert PROFILES["trn2u.48xlarge"].ultraserver_node_counts == (1, 2, 4)
    assert not PROFILES["trn2.48xlarge"].ultraserver_capable
    assert PROFILES["trn3p.48xlarge"].ultraserver_capable


def test_memory_and_cores_facts() -> None:
    assert PROFILES["trn2.48xlarge"].device_memory_bytes == 96 * 1024**3
    assert PROFILES["inf1.24xlarge"].cores_per_device == 4
    assert PROFILES["trn3.48xlarge"].device_memory_bytes == 144 * 1024**3


# --- properties over every known profile ----------------------------------------------------


@given(profiles, st.data())
def test_every_connected_group_is_a_connected_set(p: InstanceProfile, data: st.DataObject) -> None:
    size = data.draw(st.sampled_from(group_sizes(p)))
    for group in connected_groups(p, size):
        assert is_connected_set(p, group)


@given(profiles, st.data())
def test_groups_of_one_size_partition_the_devices(p: InstanceProfile, data: st.DataObject) -> None:
    size = data.draw(st.sampled_from(group_sizes(p)))
    members = [d for g in connected_groups(p, size) for d in g]
    assert sorted(members) == list(range(p.device_count))


@given(profiles, st.data())
def test_one_and_all_always_valid(p: InstanceProfile, data: st.DataObject) -> None:
    d = data.draw(st.integers(0, p.device_count - 1))
    assert is_connected_set(p, [d])
    assert is_connected_set(p, range(p.device_count))


@given(profiles, st.data())
def test_connected_set_sizes_are_valid_sizes(p: InstanceProfile, data: st.DataObject) -> None:
    ids = data.draw(st.sets(st.integers(0, p.device_count - 1), min_size=1))
    if is_connected_set(p, ids):
        assert len(ids) in p.valid_set_sizes


@given(st.integers(3, 24), st.integers(0, 23), st.integers(1, 24))
def test_ring_runs_are_connected(n: int, start: int, k: int) -> None:
    p = InstanceProfile("ringy", "x", n, 2, 0, Topology.RING)
    run = [(start + i) % n for i in range(min(k, n))]
    assert is_connected_set(p, run)


# --- generic fallback ----------------------------------------------------------------------


def test_known_type_ignores_discovery() -> None:
    assert profile_for("trn2.48xlarge", discovered_device_count=3) is PROFILES["trn2.48xlarge"]


def test_unknown_type_without_discovery_fails() -> None:
    with pytest.raises(UnknownInstanceType, match=r"trn9\.huge"):
        profile_for("trn9.huge")


def test_fallback_detects_torus() -> None:
    links = {d: torus_neighbours(4, 4, d) for d in range(16)}
    p = profile_for(
        "trn2eu.48xlarge", discovered_device_count=16, arch="Trainium2", discovered_neighbours=links
    )
    assert (p.topology, p.torus_dims, p.known) == (Topology.TORUS, (4, 4), False)
    assert (p.cores_per_device, p.default_lnc) == (8, 2)
    assert p.valid_set_sizes == (1, 4, 8, 16)


def test_fallback_detects_ring() -> None:
    links = {d: [(d - 1) % 6, (d + 1) % 6] for d in range(6)}
    p = profile_for("inf9.big", discovered_device_count=6, discovered_neighbours=links)
    assert p.topology is Topology.RING
    assert p.default_lnc == 1


def test_fallback_without_links_is_conservative() -> None:
    p = profile_for("mystery.4x", discovered_device_count=4, discovered_cores_per_device=3)
    assert p.topology is Topology.SINGLE
    assert p.valid_set_sizes == (1, 4)
    assert p.cores_per_device == 3
    assert p.device_memory_bytes == 0


def test_fallback_trainium3_is_switch() -> None:
    p = profile_for("trn3x.48xlarge", discovered_device_count=16, arch="Trainium3")
    assert p.topology is Topology.SWITCH
    assert p.device_memory_bytes == 144 * 1024**3


def test_profile_validation() -> None:
    with pytest.raises(ValueError, match="torus dims"):
        InstanceProfile("bad", "x", 16, 2, 0, Topology.TORUS, torus_dims=(4, 3))
    with pytest.raises(ValueError, match="default LNC"):
        InstanceProfile("bad", "x", 1, 2, 0, Topology.SINGLE, default_lnc=2)
