# pipeplan API and worker agent (one image; docker-compose.yml picks the command).
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
# torch is only needed by the executor (`pipeplan run`, worker image); pinned as in the Makefile
ARG WITH_TORCH=1
COPY pyproject.toml README.md ./
COPY planner planner
COPY api api
COPY db db
COPY executor executor
COPY profiler profiler
COPY pipeplan pipeplan
COPY examples examples
RUN if [ "$WITH_TORCH" = "1" ]; then pip install torch==2.13.0; fi && pip install -e .
RUN useradd --create-home pipeplan && mkdir -p /data && chown pipeplan /data
USER pipeplan
ENV PIPEPLAN_DATA_DIR=/data
EXPOSE 8000
CMD ["pipeplan", "serve", "--host", "0.0.0.0", "--port", "8000", "--upgrade"]
