# countersign's container image (docs/deployment.md#container-image).
#
#   docker build -t countersign .        (or: podman build --format docker -t countersign .)
#   docker run -p 8787:8787 -v countersign-data:/var/lib/countersign countersign
#
# Two stages: the binary is built with the `dist` profile (Cargo.toml: fat LTO, one
# codegen unit, stripped) on Debian bookworm, and copied onto distroless's `cc` image,
# which holds what it links beyond itself (glibc, libgcc_s for unwinding) and nothing
# else: no shell, no package manager, no curl. The health check is the binary's own
# `countersign healthcheck`.

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# The data directory and its keys directory are made here, owned by distroless's
# nonroot user (65532): the final stage has no shell to make them, and a volume mounted
# on either (compose.yaml shares keys/ between instances) starts with their owner.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --locked --profile dist -p countersign \
    && install -D -m 0755 target/dist/countersign /out/usr/local/bin/countersign \
    && install -d -m 0700 -o 65532 -g 65532 /out/var/lib/countersign /out/var/lib/countersign/keys

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/usr/local/bin/countersign /usr/local/bin/countersign
COPY --from=build --chown=65532:65532 /out/var/lib/countersign /var/lib/countersign
# The database and the signing keys live in the data directory: keep it on a volume.
# Inside a container, loopback is the container's own: listen where the published port
# arrives. Name the public host in COUNTERSIGN_ALLOWED_HOSTS when it is not localhost.
ENV COUNTERSIGN_DATA_DIR=/var/lib/countersign \
    COUNTERSIGN_LISTEN=0.0.0.0:8787
VOLUME ["/var/lib/countersign"]
USER 65532:65532
# 8787: MCP, the REST API and the dashboard; 9464: /metrics when [server] metrics_listen
# (COUNTERSIGN_METRICS_LISTEN=0.0.0.0:9464) is set.
EXPOSE 8787 9464
HEALTHCHECK --interval=15s --timeout=6s --start-period=10s --retries=3 \
    CMD ["countersign", "healthcheck"]
ENTRYPOINT ["countersign"]
CMD ["serve"]
