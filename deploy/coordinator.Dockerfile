# The coordinator image: hacfed-server without torch (a few hundred MB instead of several GB).
#
#   docker build -f deploy/coordinator.Dockerfile -t hacfed-coordinator .        # from the repository root
#   buildah bud --isolation chroot --storage-driver vfs -f deploy/coordinator.Dockerfile -t hacfed-coordinator .
#
# hacfed is installed with --no-deps, and its runtime dependencies from deploy/coordinator-requirements.txt:
# the coordinator never imports torch, transformers or datasets (tests/unit/test_deploy_manifests.py
# imports every hacfed.server module with only those packages importable). The image also carries
# hacfed-client, torch-free for `hacfed-client keys` only, which deploy/make-secrets.sh uses.
#
# DATA_TASKS=1 adds deploy/coordinator-data-requirements.txt (`datasets`): needed for a task read
# from files (kind = "jsonl" / "parquet", e.g. GSM8K); arithmetic and chain tasks do without it.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}
ARG DATA_TASKS=0

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HACFED_HOME=/var/lib/hacfed/home HF_HOME=/var/lib/hacfed/home/huggingface

# Dependencies first, so a source change does not re-download them.
COPY deploy/coordinator-requirements.txt deploy/coordinator-data-requirements.txt /tmp/hacfed-src/deploy/
RUN pip install -r /tmp/hacfed-src/deploy/coordinator-requirements.txt \
    && if [ "$DATA_TASKS" = 1 ]; then pip install -r /tmp/hacfed-src/deploy/coordinator-data-requirements.txt; fi

COPY pyproject.toml README.md LICENSE /tmp/hacfed-src/
COPY hacfed /tmp/hacfed-src/hacfed
COPY server /tmp/hacfed-src/server
COPY clients /tmp/hacfed-src/clients
COPY proto /tmp/hacfed-src/proto
RUN pip install --no-deps /tmp/hacfed-src && rm -rf /tmp/hacfed-src \
    && python -c "import hacfed.server.main, hacfed.server.serverapp, sys; sys.exit('torch' in sys.modules)"

COPY deploy/coordinator.toml /etc/hacfed/coordinator.toml
COPY deploy/make-secrets.sh /usr/local/bin/hacfed-make-secrets

# Not root: the state directory (journal, audit log, SuperLink database, keys) belongs to uid 10001.
# The folders exist in the image so that a fresh named volume mounted there gets this owner.
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/hacfed hacfed \
    && mkdir -p /var/lib/hacfed/coordinator /var/lib/hacfed/home /run/hacfed/certs \
    && chown -R hacfed:hacfed /var/lib/hacfed \
    && chmod 0755 /usr/local/bin/hacfed-make-secrets
USER hacfed
WORKDIR /var/lib/hacfed
EXPOSE 9092
ENTRYPOINT ["hacfed-server"]
CMD ["--config", "/etc/hacfed/coordinator.toml", "--state-dir", "/var/lib/hacfed/coordinator", \
     "--listen", "0.0.0.0:9092", "--tls-cert", "/run/hacfed/certs/server.pem", \
     "--tls-key", "/run/hacfed/certs/server.key", "--tls-ca", "/run/hacfed/certs/ca.pem"]
