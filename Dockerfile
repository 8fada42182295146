# Two images from one file:
# - the default target, every gpulens component (watcher, stream workers, ClickHouse sink, topic
#   job, the whole CLI), chosen by the command:
#     docker build -t gpulens:0.1.0 .
#     docker run gpulens watch | worker | sink | topics create | agent | ...
# - the slim node agent (`gpulens[agent]` only: no chDB, faust, pandas or pyarrow), which the
#   DaemonSet runs as `python -m producers.agent`:
#     docker build --target agent -t gpulens-agent:0.1.0 .

# Sources and a virtual environment, shared by both builds.
FROM python:3.11-slim AS build-base

ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md* ./
COPY schemas ./schemas
COPY common ./common
COPY producers ./producers
COPY stream_jobs ./stream_jobs
COPY sinks ./sinks
COPY simulation ./simulation
COPY reports ./reports
COPY gpulens ./gpulens
RUN python -m venv /opt/gpulens \
 && /opt/gpulens/bin/pip install --upgrade pip

FROM build-base AS build-agent
RUN /opt/gpulens/bin/pip install ".[agent]"

FROM build-base AS build
# Build dependencies for wheels that may have to compile (e.g. faust's C extensions).
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/*
RUN /opt/gpulens/bin/pip install ".[all]"

# What both images run on: a fixed unprivileged user (runAsNonRoot in the manifests checks the
# numeric id) and a data directory it owns; in Kubernetes the directory is an emptyDir because the
# root filesystem is mounted read-only.
FROM python:3.11-slim AS runtime
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

FROM runtime AS agent
LABEL org.opencontainers.image.title="gpulens-agent" \
      org.opencontainers.image.description="gpulens node agent: NVML + kubelet + cgroups -> Kafka" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build-agent /opt/gpulens /opt/gpulens
ENTRYPOINT ["python", "-m", "producers.agent"]

FROM runtime
LABEL org.opencontainers.image.title="gpulens" \
      org.opencontainers.image.description="See what a Kubernetes GPU fleet is really doing" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/gpulens /opt/gpulens
ENTRYPOINT ["gpulens"]
CMD ["--help"]
