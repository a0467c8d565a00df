"""A fake kube-apiserver on aiohttp, faithful where our code depends on it."""
