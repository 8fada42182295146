# One image for every gpulens component: the node agent, the cluster watcher, the stream
# workers, the ClickHouse sink and the CLI. The component is chosen by the command:
#   docker run gpulens agent | watch | worker | sink | topics create | ...
FROM python:3.11-slim AS build

ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Build dependencies for wheels that may have to compile (e.g. faust's C extensions).
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml README.md* ./
COPY schemas ./schemas
COPY common ./common
COPY producers ./producers
COPY stream_jobs ./stream_jobs
COPY sinks ./sinks
COPY gpulens ./gpulens
RUN python -m venv /opt/gpulens \
 && /opt/gpulens/bin/pip install --upgrade pip \
 && /opt/gpulens/bin/pip install .

FROM python:3.11-slim

LABEL org.opencontainers.image.title="gpulens" \
      org.opencontainers.image.description="See what a Kubernetes GPU fleet is really doing" \
      org.opencontainers.image.licenses="Apache-2.0"

COPY --from=build /opt/gpulens /opt/gpulens
# A fixed unprivileged user (runAsNonRoot in the manifests checks the numeric id) and a data
# directory it owns; in Kubernetes the directory is an emptyDir because the root filesystem
# is mounted read-only.
RUN groupadd --system --gid 10001 gpulens \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/gpulens --shell /usr/sbin/nologin gpulens \
 && mkdir -p /var/lib/gpulens \
 && chown 10001:10001 /var/lib/gpulens

ENV PATH=/opt/gpulens/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/var/lib/gpulens \
    GPULENS_DATA_DIR=/var/lib/gpulens \
    GPULENS_LOG_FORMAT=json

USER 10001:10001
WORKDIR /var/lib/gpulens
ENTRYPOINT ["gpulens"]
CMD ["--help"]
