# Sluice: a custom Caddy (standard modules + Sluice) built from the pinned
# recipe in xcaddy.json, run as a numeric non-root user on :3000 from an
# empty (scratch) base: the static binary, CA certificates and the config.
#
#   docker build -t sluice .
#   docker run --rm -p 3000:3000 sluice
#
# As a Hugging Face Inference Endpoints custom router, swap the router
# image for this one: Caddyfile.hf honours the CUSTOM_ROUTER_* variables.
#
# GO_VERSION must be at least go.mod's go directive (same major.minor);
# cmd/sluice-build's tests check it.
ARG GO_VERSION=1.26.8

# ---- build: the same command humans run, reading xcaddy.json ----
FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
# Use exactly this Go (no toolchain switch during the build); a static
# binary (the runtime image has no C library).
ENV GOTOOLCHAIN=local CGO_ENABLED=0
# Download modules first so this layer is cached until go.mod/go.sum change
# (the root module, and build/tools, which pins xcaddy).
COPY go.mod go.sum ./
COPY build/tools/go.mod build/tools/go.sum ./build/tools/
RUN go mod download && go mod download -modfile=build/tools/go.mod
COPY . .
# Fails unless the binary registers Sluice modules (see sluice.go).
RUN go run ./cmd/sluice-build -o /out/caddy \
 && /out/caddy version \
 && /out/caddy list-modules --packages | grep sluice-router/sluice
# The runtime's writable directories, owned by the runtime user (scratch
# has no shell to create them), and a /tmp.
RUN install -d -m 0750 /rootfs/var/lib/sluice/data /rootfs/var/lib/sluice/config \
 && install -d -m 1777 /rootfs/tmp

# ---- runtime: nothing but the binary, CA certificates and the config ----
FROM scratch
# Trust store for TLS to upstreams and Redis.
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build --chown=65532:65532 /rootfs/var/lib/sluice /var/lib/sluice
COPY --from=build /rootfs/tmp /tmp
COPY --from=build /out/caddy /usr/bin/caddy
COPY Caddyfile.hf /etc/sluice/Caddyfile
# Caddy writes its autosave config, certificates and locks under these.
ENV XDG_DATA_HOME=/var/lib/sluice/data \
    XDG_CONFIG_HOME=/var/lib/sluice/config \
    HOME=/var/lib/sluice
WORKDIR /var/lib/sluice
# Numeric, so that Kubernetes' runAsNonRoot can check it without a passwd.
USER 65532:65532
EXPOSE 3000
ENTRYPOINT ["/usr/bin/caddy"]
CMD ["run", "--config", "/etc/sluice/Caddyfile", "--adapter", "caddyfile"]
