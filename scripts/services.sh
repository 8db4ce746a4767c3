#!/usr/bin/env bash
# Start the services the integration tests need, if they are not already up: PostgreSQL and Redis
# on their standard ports, and Debian's chromium for the browser tests.
set -euo pipefail

# Seconds to wait for a started service to answer (a cold PostgreSQL in docker takes several).
WAIT_S="${SERVICES_WAIT_S:-30}"

# wait_up NAME PROBE...: poll PROBE once a second until it succeeds; a service that never answers
# stops the script with an error naming it, not a later test failing on a refused connection.
wait_up() {
  local name=$1
  shift
  for _ in $(seq 1 "$WAIT_S"); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 1
  done
  echo "services: $name was started but did not answer within ${WAIT_S}s ($*)" >&2
  exit 1
}

if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
  if command -v pg_ctlcluster >/dev/null 2>&1; then
    echo "starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start
  elif command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    docker run -d --rm --name draftdeck-test-pg -p 5432:5432 -e POSTGRES_HOST_AUTH_METHOD=trust postgres:16
  else
    echo "PostgreSQL is not running and cannot be started here" >&2; exit 1
  fi
  wait_up PostgreSQL pg_isready -q -h 127.0.0.1 -p 5432
fi

if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  if command -v redis-server >/dev/null 2>&1; then
    echo "starting Redis"
    mkdir -p /var/lib/redis /var/log/redis
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
      --dir /var/lib/redis --logfile /var/log/redis/ci.log
  elif command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    docker run -d --rm --name draftdeck-test-redis -p 6379:6379 redis:7
  else
    echo "Redis is not running and cannot be started here" >&2; exit 1
  fi
  wait_up Redis redis-cli -h 127.0.0.1 -p 6379 ping
fi

if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing Debian's chromium for the browser tests"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "chromium is missing: install Debian's chromium package (browser tests will be skipped)" >&2
  fi
fi
echo "services: PostgreSQL $(pg_isready -h 127.0.0.1 -p 5432 | cut -d- -f2-) · Redis $(redis-cli -h 127.0.0.1 ping) · $(command -v chromium || echo 'no chromium')"
