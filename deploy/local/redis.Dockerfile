# Redis from Debian's package, for machines with no image registry (make stack); users take the official image.
# compose.yaml starts Redis through `docker-entrypoint.sh redis-server ...` as the official image names it; here
# that name only runs its arguments, since this image is already the redis user.
ARG BASE=local/bookworm:base
FROM ${BASE}
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server \
    && rm -rf /var/lib/apt/lists/* && mkdir -p /data && chown redis:redis /data \
    && printf '#!/bin/sh\nexec "$@"\n' > /usr/local/bin/docker-entrypoint.sh && chmod 755 /usr/local/bin/docker-entrypoint.sh
USER redis
WORKDIR /data
CMD ["redis-server", "--dir", "/data"]
