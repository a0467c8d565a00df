# syntax=docker/dockerfile:1
#
# One image for both long-running processes of neuron-dra:
#   neuron-dra-kubelet-plugin   (DaemonSet on Neuron nodes)
#   neuron-dra-controller       (Deployment)
# Only the product distribution (common, controller, nodeplugin, proto). The `neuron-dra` tool
# (sim, check-claim, fake-apiserver) is the separate `neuron-dra-sim` distribution in sim/,
# run from a workstation: it is never shipped to nodes (docs/architecture.md).
#
# Build: hack/build-image [IMAGE] [TAG]   (or: docker build -t neuron-dra:dev .)
#
# The image runs as an unprivileged user (uid 65532) by default, which is all the controller
# needs. The kubelet plugin needs root: it reads /sys and /dev/neuron*, writes CDI specs to the
# host's /var/run/cdi and serves sockets in the kubelet's plugin directories. The Helm chart
# sets the plugin container's securityContext accordingly; see docs/configuration.md.

ARG PYTHON_IMAGE=python:3.11-slim

# --- builder: wheels for the project and every dependency ------------------------------------
FROM ${PYTHON_IMAGE} AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /src
# Only what the wheel is built from (.dockerignore keeps the rest out of the context); the
# dependency layer is rebuilt only when these change.
COPY pyproject.toml README.md constraints.txt ./
COPY common/ common/
COPY controller/ controller/
COPY nodeplugin/ nodeplugin/
COPY proto/ proto/

# `pip wheel .` builds our wheel (hatchling) and collects wheels for all runtime dependencies,
# so the runtime stage installs offline and needs no compiler. The slim image has no compiler
# either: every dependency must publish a wheel for the target platform (they do for
# linux/amd64; check grpcio and pydantic-core before building for another one).
# constraints.txt: the versions CI tested (the build backend's environment too, through
# PIP_CONSTRAINT), not the newest each range allows on the day of the build.
RUN PIP_CONSTRAINT=/src/constraints.txt pip wheel --wheel-dir /wheels .

# --- runtime -----------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime

ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
# hack/build-image passes the git remote, when there is one.
ARG SOURCE=""

LABEL org.opencontainers.image.title="neuron-dra" \
      org.opencontainers.image.description="AWS Neuron DRA kubelet plugin and UltraServer controller for Kubernetes 1.34+" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0"

# libudev1: pyudev loads libudev.so.1 to enumerate Neuron devices (the plugin falls back to the
# pure sysfs scanner without it, but udev is the production path).
RUN apt-get update \
    && apt-get install -y --no-install-recommends libudev1 \
    && rm -rf /var/lib/apt/lists/*

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels neuron-dra \
    && neuron-dra-kubelet-plugin --help >/dev/null \
    && neuron-dra-controller --help >/dev/null \
    && ! python -c 'import neuron_dra.sim' 2>/dev/null

# A fixed numeric uid so that `runAsNonRoot` can be verified by the kubelet.
RUN groupadd --system --gid 65532 neuron-dra \
    && useradd --system --uid 65532 --gid 65532 --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin neuron-dra
USER 65532:65532

# No ENTRYPOINT: the chart sets `command` per component (neuron-dra-kubelet-plugin or
# neuron-dra-controller). Running the image bare prints the controller's usage.
CMD ["neuron-dra-controller", "--help"]
