"""The cluster-level controller: UltraServer discovery and workload allocation."""
