"""The controller's allocation: which UltraServer units each workload gets.

- :mod:`.planner`: the decisions (pure, no state): requests, units, ``plan``/``plan_on``,
  ``plan_replacement``/``plan_replacement_on``;
- :mod:`.units`: the units one UltraServer offers and how they rank (pure);
- :mod:`.unitindex`: the fleet's free units, kept current as UltraServers change;
- :mod:`.servers`: UltraServer states from NeuronUltraServer objects (pure);
- :mod:`.cache`: those states kept current one object at a time.
"""
