# The project image: Prefect server, MLflow server and workers all run from it (docker-compose.yml).
# CPU build (default):  docker build -t ttt-pipeline .
# GPU build (CUDA torch from PyPI): docker build --build-arg TORCH_INDEX_URL=https://pypi.org/simple -t ttt-pipeline:gpu .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TOKENIZERS_PARALLELISM=false HF_HUB_DISABLE_PROGRESS_BARS=1 MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR=false \
    PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=1 \
    TTT_PIPELINE_HOME=/srv/ttt

RUN apt-get update \
 && apt-get install -y --no-install-recommends curl tini \
 && rm -rf /var/lib/apt/lists/*

# torch first, pinned: from the PyTorch CPU index by default (a plain PyPI install pulls GBs of CUDA wheels)
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN pip install "torch==2.13.0" --index-url "${TORCH_INDEX_URL}"

WORKDIR /opt/ttt-pipeline
COPY pyproject.toml README.md* LICENSE constraints.txt ./
COPY ttt_pipeline ttt_pipeline
COPY prefect.yaml ./
# editable, with the extras a worker may need (attribution: traker; gdrive: gdown); the presets (and the demo
# reviews) ship inside the package; psycopg2 is MLflow's postgres driver (Prefect's, asyncpg, is already one of its
# dependencies)
RUN pip install -e ".[attribution,gdrive]" "psycopg2-binary>=2.9" -c constraints.txt \
 && pip check

COPY ttt_pipeline/presets/demo /srv/ttt/data/demo
RUN useradd --create-home --uid 1000 ttt \
 && mkdir -p /srv/ttt/.cache /mlflow \
 && chown -R ttt:ttt /srv/ttt /mlflow
USER ttt
WORKDIR /srv/ttt
ENTRYPOINT ["tini", "--"]
CMD ["ttt-pipeline", "--help"]
