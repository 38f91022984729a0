# Two images, one per role, from one file:
#
#   docker build --target bot -t animegamer-bot .        the Discord bot: no torch, about 200 MB of Python
#   docker build --target worker -t animegamer-worker .  a GPU worker: torch and the model libraries, on CUDA
#
# The bases are build arguments, so the usual images serve users and a locally made Debian image serves machines
# without a registry (deploy/local/base-image.sh). Install steps are the Makefile's: torch first, on its own
# (TORCH_SPEC), then the project with its role's extras. Each image runs as an unprivileged user, holds no secret
# (DISCORD_TOKEN and the URLs come from the environment at run time, see compose.yaml) and keeps its data in
# /data, a volume.
ARG BASE=python:3.11-slim
ARG WORKER_BASE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04

# --- the bot -------------------------------------------------------------------------------------------------
FROM ${BASE} AS bot-build
COPY deploy/python.sh /usr/local/bin/ensure-python
RUN sh /usr/local/bin/ensure-python
RUN python3 -m venv /opt/animegamer
ENV PATH=/opt/animegamer/bin:$PATH PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY pyproject.toml README.md /src/
COPY game /src/game
COPY db /src/db
COPY migrations /src/migrations
COPY relay /src/relay
COPY media /src/media
COPY bot /src/bot
COPY worker /src/worker
COPY training /src/training
COPY animegamer /src/animegamer
RUN pip install "/src[bot,postgres]"

FROM ${BASE} AS bot
COPY deploy/python.sh /usr/local/bin/ensure-python
RUN sh /usr/local/bin/ensure-python
COPY --from=bot-build /opt/animegamer /opt/animegamer
RUN useradd --system --uid 10001 --home-dir /data --create-home animegamer
ENV PATH=/opt/animegamer/bin:$PATH PYTHONUNBUFFERED=1 ANIMEGAMER_DATA_DIR=/data
USER animegamer
WORKDIR /data
VOLUME /data
ENTRYPOINT ["animegamer"]
CMD ["bot"]

# --- a worker ------------------------------------------------------------------------------------------------
FROM ${WORKER_BASE} AS worker-build
COPY deploy/python.sh /usr/local/bin/ensure-python
RUN sh /usr/local/bin/ensure-python
RUN python3 -m venv /opt/animegamer
ENV PATH=/opt/animegamer/bin:$PATH PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# torch first, on its own: PyPI's Linux torch is the CUDA build; a wheel in deploy/wheels/ (make stack's CPU
# one) is taken before any index.
ARG TORCH_SPEC=torch==2.13.0
COPY deploy/wheels /wheels
RUN pip install --find-links /wheels ${TORCH_SPEC}
COPY --from=bot-build /src /src
RUN pip install --find-links /wheels "/src[worker,postgres]"

FROM ${WORKER_BASE} AS worker
COPY deploy/python.sh /usr/local/bin/ensure-python
RUN sh /usr/local/bin/ensure-python
COPY --from=worker-build /opt/animegamer /opt/animegamer
RUN useradd --system --uid 10001 --home-dir /data --create-home animegamer
# The published checkpoints are mounted read-only at /checkpoints (compose.yaml); the model loads once, as the
# worker starts (`animegamer worker` preloads it in its one pool child), and /readyz says so.
ENV PATH=/opt/animegamer/bin:$PATH PYTHONUNBUFFERED=1 ANIMEGAMER_DATA_DIR=/data ANIMEGAMER_CHECKPOINTS=/checkpoints \
    HF_HOME=/data/hf
USER animegamer
WORKDIR /data
VOLUME /data
ENTRYPOINT ["animegamer"]
CMD ["worker"]
