# One image for every gswarm process; docker-compose.yml picks the command.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev make \
    && rm -rf /var/lib/apt/lists/*
RUN useradd --create-home --uid 1000 gswarm
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY gswarm_tasks ./gswarm_tasks
COPY gswarm_web ./gswarm_web
COPY migrations ./migrations
COPY config ./config
RUN pip install -e . && mkdir -p /data && chown gswarm /data
USER gswarm
ENV GSWARM_HOME=/data
EXPOSE 8091
CMD ["gunicorn", "--bind", "0.0.0.0:8091", "--workers", "2", "--threads", "4", "--worker-class", "gthread", "gswarm_web:create_app()"]
