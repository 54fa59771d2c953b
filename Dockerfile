# delayq image. The default target runs a node; the `reconcile` target adds the Java runtime
# Spark needs for `delayq reconcile`. Image repository and tag are Helm values.
#
#   docker build -t REGISTRY/delayq:0.1.0 .
#   docker build --target reconcile -t REGISTRY/delayq:0.1.0-spark .
#
# Bookworm, not the floating slim tag: its openjdk-17 is the Java that PySpark 4 supports.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# The wheel, built from the tree: the image installs exactly what `pip wheel .` makes (and what
# tests/integration/test_wheel.py installs in a fresh virtualenv), never the source folders.
FROM ${PYTHON_IMAGE} AS wheel
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# .dockerignore keeps the venv, tests and docs out of the context.
COPY . /tmp/src
RUN pip wheel --no-deps --wheel-dir /tmp/dist /tmp/src

FROM ${PYTHON_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# The uid/gid the Helm chart runs as (podSecurityContext.runAsUser / fsGroup).
RUN groupadd --system --gid 10001 delayq \
 && useradd --system --uid 10001 --gid 10001 --home-dir /home/delayq --create-home --shell /usr/sbin/nologin delayq \
 && mkdir -p /data \
 && chown 10001:10001 /data
COPY --from=wheel /tmp/dist/ /tmp/dist/
COPY constraints.txt /tmp/constraints.txt
# A node, its console and the reconciliation (extras node, console and reconcile), at the versions CI passed with.
RUN pip install -c /tmp/constraints.txt "$(ls /tmp/dist/delayq-*.whl)[node,console,reconcile]" \
 && rm -rf /tmp/dist /tmp/constraints.txt
WORKDIR /home/delayq
ENV DELAYQ_DATA_DIR=/data \
    DELAYQ_HTTP_HOST=0.0.0.0 \
    DELAYQ_HTTP_PORT=8080
EXPOSE 8080
ENTRYPOINT ["delayq"]
CMD ["node"]

FROM base AS reconcile
USER root
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
 && rm -rf /var/lib/apt/lists/*
USER 10001:10001
CMD ["reconcile"]

# Last stage: what a plain `docker build .` gives.
FROM base AS node
USER 10001:10001
