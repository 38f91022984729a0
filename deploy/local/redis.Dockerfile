# Redis from Debian's package, for machines with no image registry (make stack); users take the official image.
ARG BASE=local/bookworm:base
FROM ${BASE}
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server \
    && rm -rf /var/lib/apt/lists/* && mkdir -p /data && chown redis:redis /data
USER redis
WORKDIR /data
# As the official image does: no protected mode, since a container is reached over its network, never loopback.
ENTRYPOINT ["sh", "-c", "exec \"$@\" --protected-mode no", "--"]
CMD ["redis-server", "--dir", "/data"]
