# Prometheus for deploy/docker-compose.yml, from Debian's package: the stack then needs no registry beyond a Debian
# image. The compose file mounts the configuration and the alert rules.
ARG BASE=debian:bookworm
FROM ${BASE}
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus >/dev/null \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /prometheus && chown prometheus:prometheus /prometheus
USER prometheus
VOLUME ["/prometheus"]
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
