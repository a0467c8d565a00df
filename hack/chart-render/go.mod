module neuron-dra/hack/chart-render

go 1.24
