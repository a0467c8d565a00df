"""Publishing this node's devices: the ResourceSlice and the Node's UltraServer labels.

``sliceplan`` computes the desired slices (pure, with the generation bump) and which watch
events need a sync; ``publisher`` converges the API to them (create/update/delete) on every
trigger through the single-key ``syncworker``; ``nodelabels`` patches the Node's labels;
``metrics`` counts what was published.
"""
