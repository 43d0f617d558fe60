# syntax=docker/dockerfile:1
# Mosquitto as `edgefleet init` configures it: Debian's package (2.0.11 on bookworm, the version the tests run),
# whose dynamic-security plugin sits where the generated mosquitto.conf names it. The deployment directory is
# mounted at /edgefleet and the broker runs from it (the compose file there does this, as the user its .env names).
#
#   docker build -f deploy/docker/mosquitto.Dockerfile -t edgefleet-mosquitto .
FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends mosquitto \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /edgefleet
ENTRYPOINT []
CMD ["mosquitto", "-c", "mosquitto.conf"]
