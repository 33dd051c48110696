# One image for every gswarm process; docker-compose.yml picks the command (nginx-light: the API's proxy there).
# `--build-arg EXTRAS=serve` adds the built-in model server's libraries (torch, sentence-transformers) for nodes
# that serve models; without it a node downloads, copies and stages models but cannot serve them.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev make nginx-light \
    && rm -rf /var/lib/apt/lists/*
RUN useradd --create-home --uid 1000 gswarm
WORKDIR /app
ARG EXTRAS=""
# The dependencies first, from pyproject.toml and the lock alone (the versions `make` installs): a change to the code
# rebuilds only the layers below. Wheels in a `wheels/` directory of the build context are installed first (a CPU
# build of torch, say; none in the project).
COPY pyproject.toml requirements.lock wheels* /tmp/build/
RUN cd /tmp/build && python -c "import sys, tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
extra = [d for e in sys.argv[1].split(',') if e for d in p['optional-dependencies'][e]]; \
print('\n'.join(p['dependencies'] + extra))" "$EXTRAS" > requirements.txt \
    && pip install -c requirements.lock pip setuptools wheel \
    && pip install -c requirements.lock $(ls *.whl 2>/dev/null) -r requirements.txt && rm -rf /tmp/build
COPY pyproject.toml README.md alembic.ini ./
COPY gswarm_tasks ./gswarm_tasks
COPY gswarm_web ./gswarm_web
COPY migrations ./migrations
COPY config ./config
RUN pip install --no-deps --no-build-isolation -e . && mkdir -p /data && chown gswarm /data && chmod 0700 /data
USER gswarm
ENV GSWARM_HOME=/data
EXPOSE 8091 8080
# gswarm up's web command line (gswarm_web.cli.up.web_argv), as docker-compose.yml's web service runs it
CMD ["gunicorn", "--bind", "0.0.0.0:8091", "--workers", "4", "--worker-class", "gevent", "--worker-connections", "1000", "--graceful-timeout", "2", "--access-logfile", "-", "gswarm_web:create_app()"]
