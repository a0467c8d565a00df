"""Finding the Neuron devices of this node: sysfs/dev scanning, udev, emulation."""
