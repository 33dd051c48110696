#!/usr/bin/env bash
# Start Redis and PostgreSQL when they are not already answering; install docker-compose for the compose check.
set -u
REDIS_PORT=${REDIS_PORT:-6379}
PG_HOST=${PG_HOST:-127.0.0.1}

# A machine without them gets Debian's packages (as root); one that has them only starts them.
apt_install() {
  [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 || { echo "$* missing: install it (apt-get install $*)" >&2; return 1; }
  echo "installing $*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null 2>&1; }
}
command -v redis-server >/dev/null 2>&1 || apt_install redis-server redis-tools
ls /etc/postgresql/*/main >/dev/null 2>&1 || apt_install postgresql
if ! redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping >/dev/null 2>&1; then
  echo "starting redis on 127.0.0.1:$REDIS_PORT"
  redis-server --daemonize yes --bind 127.0.0.1 --port "$REDIS_PORT" --save "" --appendonly no
fi
if ! pg_isready -h "$PG_HOST" -q 2>/dev/null; then
  echo "starting postgresql"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start
fi
for _ in $(seq 1 100); do
  redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping >/dev/null 2>&1 && pg_isready -h "$PG_HOST" -q && break
  sleep 0.1
done
redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping >/dev/null || { echo "redis is not answering" >&2; exit 1; }
pg_isready -h "$PG_HOST" -q || { echo "postgresql is not answering" >&2; exit 1; }
if ! command -v docker-compose >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing docker-compose (validates docker-compose.yml)"
  (apt-get install -y -q docker-compose >/dev/null 2>&1 || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q docker-compose >/dev/null 2>&1)) \
    || echo "docker-compose could not be installed; the compose test checks the file's structure only" >&2
fi
exit 0
