# Sluice: a custom Caddy (standard modules + Sluice) built from the pinned
# recipe in xcaddy.json, run as a non-root user on :3000.
#
#   docker build -t sluice .
#   docker run --rm -p 3000:3000 sluice
#
# GO_VERSION must be at least go.mod's go directive (same major.minor);
# cmd/sluice-build's tests check it.
ARG GO_VERSION=1.26.8

# ---- build: the same command humans run, reading xcaddy.json ----
FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
# Use exactly this Go (no toolchain switch during the build).
ENV GOTOOLCHAIN=local CGO_ENABLED=0
# Download modules first so this layer is cached until go.mod/go.sum change.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# Fails unless the binary registers Sluice modules (see sluice.go).
RUN go run ./cmd/sluice-build -o /out/caddy \
 && /out/caddy version \
 && /out/caddy list-modules --packages | grep sluice-router/sluice

# ---- runtime ----
FROM debian:bookworm-slim
RUN groupadd --system --gid 10001 sluice \
 && useradd --system --uid 10001 --gid sluice --home-dir /var/lib/sluice --no-create-home --shell /usr/sbin/nologin sluice \
 && install -d -o sluice -g sluice -m 0750 /var/lib/sluice /var/lib/sluice/data /var/lib/sluice/config
# Trust store for TLS to upstreams (copied from the build image: no apt needed).
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/caddy /usr/bin/caddy
COPY Caddyfile.hf /etc/sluice/Caddyfile
# Caddy writes its autosave config, certificates and locks under these.
ENV XDG_DATA_HOME=/var/lib/sluice/data \
    XDG_CONFIG_HOME=/var/lib/sluice/config \
    HOME=/var/lib/sluice
WORKDIR /var/lib/sluice
USER sluice:sluice
EXPOSE 3000
ENTRYPOINT ["/usr/bin/caddy"]
CMD ["run", "--config", "/etc/sluice/Caddyfile", "--adapter", "caddyfile"]
