"""CRD structural schemas for the fake API server: pruning, defaults, validation and CEL rules,
for the schema keywords our CRDs use (others are refused at load; docs/sim.md).

``schema`` is the entry (``CRDSchema``, ``validate_crd_manifest``); ``build`` compiles a schema
into nodes, ``cel`` compiles and evaluates the rules, ``validate`` walks an object.
"""
