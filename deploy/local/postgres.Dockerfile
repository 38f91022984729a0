# PostgreSQL from Debian's package, for machines with no image registry (make stack); users take the official
# image. It reads the official image's POSTGRES_USER, POSTGRES_PASSWORD and POSTGRES_DB and keeps its data in
# the same place, so compose.yaml serves both.
ARG BASE=local/bookworm:base
FROM ${BASE}
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql \
    && rm -rf /var/lib/apt/lists/* && mkdir -p /var/lib/postgresql/data /var/run/postgresql \
    && chown -R postgres:postgres /var/lib/postgresql /var/run/postgresql
COPY postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint.sh
ENV PATH=/usr/lib/postgresql/15/bin:$PATH PGDATA=/var/lib/postgresql/data
USER postgres
ENTRYPOINT ["sh", "/usr/local/bin/postgres-entrypoint.sh"]
