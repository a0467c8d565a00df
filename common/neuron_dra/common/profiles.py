"""Instance-type profiles: what a Neuron instance type looks like and which device sets on it
are connected (the rules users see are in the README, "Connected devices").

A profile answers questions whose answers must agree between the kubelet plugin (which
publishes connected-group attributes and checks prepared sets) and the controller and
``check-claim`` (which reason about what a claim can get). Every decision is a pure function
of a profile, so the rules live in one place and are tested without hardware.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

GIB = 1024**3


class UltraServerMode(enum.IntEnum):
    """The Neuron driver's UltraServer mode enum, not a node count: the values of its
    ``ultraserver_mode`` sysfs file (discovery reads them) and of the runtime's
    ``NEURON_RT_ULTRASERVER_MODE`` (Prepare sets it)."""

    X4 = 1  # 4 nodes
    X2H = 2  # 2 nodes over horizontal links
    X2V = 3  # 2 nodes over vertical links
    X1 = 4  # single node

    @property
    def node_count(self) -> int:
        return {UltraServerMode.X4: 4, UltraServerMode.X2H: 2, UltraServerMode.X2V: 2}.get(self, 1)


class Topology(enum.StrEnum):
    """How the Neuron devices of one instance are linked."""

    #: One device, or devices with no known links: only one device or all of them form a
    #: connected set.
    SINGLE = "single"
    #: Devices 0..N-1 in a ring (Inf1, Inf2): any run of contiguous devices, with wrap-around.
    RING = "ring"
    #: A 2D torus (Trn1, Trn2): rows, pairs of adjacent rows, or everything.
    TORUS = "torus"
    #: All-to-all through a switch (Trn3): every subset is connected.
    SWITCH = "switch"


@dataclass(frozen=True)
class InstanceProfile:
    name: str
    family: str
    device_count: int
    #: Physical NeuronCores per device (what sysfs ``core_count`` reports; not LNC-aware).
    cores_per_device: int
    #: HBM per device; 0 when unknown (generic profiles for types we have no facts about).
    device_memory_bytes: int
    topology: Topology
    #: (rows, columns) for TORUS, else None. Device d sits at row d // columns.
    torus_dims: tuple[int, int] | None = None
    default_lnc: int = 1
    allowed_lnc: frozenset[int] = frozenset({1})
    #: Node counts an UltraServer of this type can be used in; empty if not UltraServer-capable.
    ultraserver_node_counts: tuple[int, ...] = ()
    #: False for profiles synthesised from discovery for an unknown instance type.
    known: bool = True
    #: Per-device chip name as sysfs ``info/architecture/device_name`` reports it.
    device_name: str = ""
    _valid_sizes: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.device_count < 1:
            raise ValueError(f"{self.name}: device_count must be >= 1")
        if self.default_lnc not in self.allowed_lnc:
            raise ValueError(f"{self.name}: default LNC {self.default_lnc} not allowed")
        if self.topology is Topology.TORUS:
            if self.torus_dims is None or self.torus_dims[0] * self.torus_dims[1] != (
                self.device_count
            ):
                raise ValueError(f"{self.name}: torus dims must multiply to the device count")
        elif self.torus_dims is not None:
            raise ValueError(f"{self.name}: torus_dims given for a {self.topology} topology")
        object.__setattr__(self, "_valid_sizes", _valid_set_sizes(self))

    @property
    def ultraserver_capable(self) -> bool:
        return bool(self.ultraserver_node_counts)

    @property
    def valid_set_sizes(self) -> tuple[int, ...]:
        """Device counts a claim on one node of this type may be prepared with."""
        return self._valid_sizes

    def logical_cores_per_device(self, lnc: int | None = None) -> int:
        """Logical NeuronCores per device at ``lnc`` (default: the type's default LNC)."""
        lnc = self.default_lnc if lnc is None else lnc
        if lnc not in self.allowed_lnc:
            raise ValueError(
                f"logicalNeuronCore {lnc} is not supported on {self.name} "
                f"(supported: {', '.join(str(v) for v in sorted(self.allowed_lnc))})"
            )
        return self.cores_per_device // lnc


def _valid_set_sizes(p: InstanceProfile) -> tuple[int, ...]:
    n = p.device_count
    match p.topology:
        case Topology.SINGLE:
            return tuple(sorted({1, n}))
        case Topology.RING | Topology.SWITCH:
            return tuple(range(1, n + 1))
        case Topology.TORUS:
            assert p.torus_dims is not None
            rows, cols = p.torus_dims
            sizes = {1, cols, n}
            if rows % 2 == 0:
                sizes.add(n // 2)  # a half: rows/2 adjacent rows
            return tuple(sorted(sizes))


# --- connected groups ------------------------------------------------------------------------


def connected_groups(profile: InstanceProfile, size: int) -> list[tuple[int, ...]]:
    """The aligned connected groups of ``size`` devices that get a ``devicegroup{size}_id``.

    DRA's ``matchAttribute`` can only express fixed groups, so for ring and switch topologies
    (where many overlapping sets are connected) we publish the aligned blocks
    ``[k*size, (k+1)*size)`` for sizes that divide the device count; other sizes get no group.
    On a torus the blocks are exactly the rows, the halves and the whole instance. The
    groups of one size partition the devices.
    """
    n = profile.device_count
    if size < 1 or size > n or n % size != 0 or size not in profile.valid_set_sizes:
        return []
    return [tuple(range(start, start + size)) for start in range(0, n, size)]


def group_sizes(profile: InstanceProfile) -> tuple[int, ...]:
    """Every size for which ``connected_groups`` publishes groups."""
    return tuple(s for s in profile.valid_set_sizes if connected_groups(profile, s))


def group_index(profile: InstanceProfile, device_id: int, size: int) -> int:
    """Index of the ``size`` group holding ``device_id`` (``topology4_id`` = group_index(d, 4))."""
    if not connected_groups(profile, size):
        raise ValueError(f"{profile.name} has no connected groups of {size} devices")
    _check_ids(profile, [device_id])
    return device_id // size


def is_connected_set(profile: InstanceProfile, device_ids: Collection[int]) -> bool:
    """Whether ``device_ids`` may be prepared together as one claim on this instance type.

    One device and all devices are always valid. Raises ValueError for duplicate or
    out-of-range ids: those indicate a bug upstream, not a user choice.
    """
    ids = _check_ids(profile, device_ids)
    k, n = len(ids), profile.device_count
    if k == 0:
        return False
    if k == 1 or k == n:
        return True
    match profile.topology:
        case Topology.SINGLE:
            return False
        case Topology.SWITCH:
            return True
        case Topology.TORUS:
            return tuple(sorted(ids)) in connected_groups(profile, k)
        case Topology.RING:
            # A contiguous run, possibly wrapping past device n-1 to device 0: exactly one
            # member has its predecessor outside the set.
            return sum(1 for d in ids if (d - 1) % n not in ids) == 1


def connected_set_error(profile: InstanceProfile, count: int) -> str:
    """The user-facing rejection for a request of ``count`` devices (the scheduler
    extension's wording, which users already search for)."""
    return (
        f"Instance type {profile.name} does not support requests for device: {count}. "
        "Please request a different number of devices."
    )


def coordinates(profile: InstanceProfile, device_id: int) -> tuple[int, int]:
    """(x, y) = (row, column) of a device on a torus instance."""
    if profile.torus_dims is None:
        raise ValueError(f"{profile.name} is not a torus instance type")
    _check_ids(profile, [device_id])
    cols = profile.torus_dims[1]
    return device_id // cols, device_id % cols


def torus_neighbours(rows: int, cols: int, device_id: int) -> frozenset[int]:
    """The up/down/left/right neighbours of a device on a rows x cols torus (with wrap)."""
    r, c = divmod(device_id, cols)
    return frozenset(
        {
            ((r - 1) % rows) * cols + c,
            ((r + 1) % rows) * cols + c,
            r * cols + (c - 1) % cols,
            r * cols + (c + 1) % cols,
        }
        - {device_id}
    )


def _check_ids(profile: InstanceProfile, device_ids: Iterable[int]) -> frozenset[int]:
    ids = list(device_ids)
    unique = frozenset(ids)
    if len(unique) != len(ids):
        raise ValueError(f"duplicate device ids in {sorted(ids)}")
    bad = sorted(d for d in unique if not 0 <= d < profile.device_count)
    if bad:
        raise ValueError(
            f"device ids {bad} out of range for {profile.name} ({profile.device_count} devices)"
        )
    return unique


# --- the known instance types ----------------------------------------------------------------

_LNC_TRN: tuple[int, frozenset[int]] = (2, frozenset({1, 2}))
_LNC_NONE: tuple[int, frozenset[int]] = (1, frozenset({1}))


def _family(name: str) -> str:
    return name.split(".", 1)[0]


def _profile(
    name: str,
    devices: int,
    cores: int,
    mem_gib: int,
    chip: str,
    topology: Topology,
    *,
    lnc: bool = False,
    ultraserver: tuple[int, ...] = (),
) -> InstanceProfile:
    default_lnc, allowed_lnc = _LNC_TRN if lnc else _LNC_NONE
    return InstanceProfile(
        name=name,
        family=_family(name),
        device_count=devices,
        cores_per_device=cores,
        device_memory_bytes=mem_gib * GIB,
        topology=topology,
        torus_dims=(4, 4) if topology is Topology.TORUS else None,
        default_lnc=default_lnc,
        allowed_lnc=allowed_lnc,
        ultraserver_node_counts=ultraserver,
        device_name=chip,
    )


_SINGLE, _RING, _TORUS, _SWITCH = Topology.SINGLE, Topology.RING, Topology.TORUS, Topology.SWITCH
_US = (1, 2, 4)

_PROFILES: tuple[InstanceProfile, ...] = (
    # Inferentia: 4 NeuronCore-v1, 8 GiB per chip; chips linked in a chain the scheduler
    # extension treats as a ring.
    _profile("inf1.xlarge", 1, 4, 8, "Inferentia", _SINGLE),
    _profile("inf1.2xlarge", 1, 4, 8, "Inferentia", _SINGLE),
    _profile("inf1.6xlarge", 4, 4, 8, "Inferentia", _RING),
    _profile("inf1.24xlarge", 16, 4, 8, "Inferentia", _RING),
    # Inferentia2: 2 NeuronCore-v2, 32 GiB per chip; NeuronLink-v2 ring with wrap-around.
    _profile("inf2.xlarge", 1, 2, 32, "Inferentia2", _SINGLE),
    _profile("inf2.8xlarge", 1, 2, 32, "Inferentia2", _SINGLE),
    _profile("inf2.24xlarge", 6, 2, 32, "Inferentia2", _RING),
    _profile("inf2.48xlarge", 12, 2, 32, "Inferentia2", _RING),
    # Trainium: 2 NeuronCore-v2, 32 GiB per chip; 4x4 2D torus on the 32xlarge sizes.
    _profile("trn1.2xlarge", 1, 2, 32, "Trainium1", _SINGLE),
    _profile("trn1.32xlarge", 16, 2, 32, "Trainium1", _TORUS),
    _profile("trn1n.32xlarge", 16, 2, 32, "Trainium1", _TORUS),
    # Trainium2: 8 NeuronCore-v3, 96 GiB per chip, LNC default 2; 4x4 2D torus.
    # trn2.3xlarge (1 chip) and trn2n.48xlarge have no arch-doc table: the former's chip count
    # is third-party, the latter is assumed to match trn2.48xlarge (it is the neuron-ls example
    # host, which shows the same 16-device torus).
    _profile("trn2.3xlarge", 1, 8, 96, "Trainium2", _SINGLE, lnc=True),
    _profile("trn2.48xlarge", 16, 8, 96, "Trainium2", _TORUS, lnc=True),
    _profile("trn2n.48xlarge", 16, 8, 96, "Trainium2", _TORUS, lnc=True),
    _profile("trn2u.48xlarge", 16, 8, 96, "Trainium2", _TORUS, lnc=True, ultraserver=_US),
    # Trainium3: 8 NeuronCore-v4, 144 GiB per chip, all-to-all through NeuronSwitch.
    # UNCERTAIN: Trn3 instance names are not a stable public list. 16 chips per server is
    # the Gen1 UltraServer shape (4 servers x 16) and matches the 16-EFA lookup tables. LNC 2
    # as default is inferred ("Trn2 and Trn3 provide two physical cores per logical core").
    # trn3p is the driver's UltraServer platform and trn3s its PDS platform (the operator's
    # "Trn3pds"); both take 1/2/4-node units like the operator's topologySize. Whether plain
    # trn3.48xlarge joins UltraServers is unknown: treated as standalone.
    _profile("trn3.48xlarge", 16, 8, 144, "Trainium3", _SWITCH, lnc=True),
    _profile("trn3p.48xlarge", 16, 8, 144, "Trainium3", _SWITCH, lnc=True, ultraserver=_US),
    _profile("trn3s.48xlarge", 16, 8, 144, "Trainium3", _SWITCH, lnc=True, ultraserver=_US),
)

PROFILES: Mapping[str, InstanceProfile] = {p.name: p for p in _PROFILES}


# --- generic fallback -------------------------------------------------------------------------


@dataclass(frozen=True)
class _ChipFacts:
    cores: int
    memory_gib: int
    lnc: bool


# Keyed by sysfs device_name. Used only when the instance type is unknown.
_CHIPS: Mapping[str, _ChipFacts] = {
    "Inferentia": _ChipFacts(4, 8, lnc=False),
    "Inferentia2": _ChipFacts(2, 32, lnc=False),
    "Trainium1": _ChipFacts(2, 32, lnc=False),
    "Trainium2": _ChipFacts(8, 96, lnc=True),
    "Trainium3": _ChipFacts(8, 144, lnc=True),
}


class UnknownInstanceType(LookupError):
    """No profile for the type and not enough discovered data to build one."""


def profile_for(
    instance_type: str,
    *,
    discovered_device_count: int | None = None,
    discovered_cores_per_device: int | None = None,
    arch: str | None = None,
    discovered_neighbours: Mapping[int, Collection[int]] | None = None,
) -> InstanceProfile:
    """The profile for ``instance_type``; for an unknown type, one built from discovery.

    Known types ignore the discovered values: the table is authoritative (a device missing
    from discovery is a health problem, not a different instance type).

    The generic fallback, for new instance types we have no facts about:
    - cores and memory from ``discovered_cores_per_device`` / the chip's known facts
      (``arch`` = sysfs ``device_name``, e.g. ``Trainium2``), memory 0 if unknown;
    - LNC 2 (allowed 1, 2) on Trainium2/3, else 1;
    - topology from ``discovered_neighbours`` (sysfs ``connected_devices``): a 4-regular
      rows x cols torus or a ring if the links form one exactly; SWITCH for Trainium3 (its
      fabric is all-to-all); otherwise SINGLE, i.e. only one device or all of them, which is
      safe when we do not know how devices are linked.
    """
    known = PROFILES.get(instance_type)
    if known is not None:
        return known
    if discovered_device_count is None or discovered_device_count < 1:
        raise UnknownInstanceType(
            f"unknown instance type {instance_type!r} and no discovered devices to describe it"
        )
    n = discovered_device_count
    chip = _CHIPS.get(arch or "")
    cores = discovered_cores_per_device or (chip.cores if chip else 1)
    default_lnc, allowed_lnc = _LNC_TRN if chip is not None and chip.lnc else _LNC_NONE
    topology, dims = _infer_topology(n, discovered_neighbours or {}, arch)
    return InstanceProfile(
        name=instance_type,
        family=_family(instance_type),
        device_count=n,
        cores_per_device=cores,
        device_memory_bytes=chip.memory_gib * GIB if chip else 0,
        topology=topology,
        torus_dims=dims,
        default_lnc=default_lnc,
        allowed_lnc=allowed_lnc,
        known=False,
        device_name=arch or "",
    )


def _infer_topology(
    n: int, neighbours: Mapping[int, Collection[int]], arch: str | None
) -> tuple[Topology, tuple[int, int] | None]:
    if n == 1:
        return Topology.SINGLE, None
    links = {d: frozenset(neighbours.get(d, ())) for d in range(n)}
    for rows in range(3, n // 3 + 1):
        cols = n // rows
        is_torus = rows * cols == n and cols >= 3
        if is_torus and all(links[d] == torus_neighbours(rows, cols, d) for d in range(n)):
            return Topology.TORUS, (rows, cols)
    if n >= 3 and all(links[d] == {(d - 1) % n, (d + 1) % n} for d in range(n)):
        return Topology.RING, None
    if arch == "Trainium3":
        return Topology.SWITCH, None
    return Topology.SINGLE, None
