#!/usr/bin/env bash
# Start the services the tests use when they are down, with this machine kind's own commands.
# On a machine where they already run, this only checks them.
set -euo pipefail

pg_up() { pg_isready -q -h 127.0.0.1 -p 5432; }
redis_up() { redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; }

if ! pg_up; then
  echo "services: starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start
  for _ in $(seq 1 30); do pg_up && break; sleep 1; done
fi
if ! redis_up; then
  echo "services: starting Redis"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  for _ in $(seq 1 30); do redis_up && break; sleep 1; done
fi
# MariaDB keeps the test Slurm cluster's accounting (slurmdbd; tests/support/slurm.py).
mariadb_up() { mariadb-admin -h 127.0.0.1 -u root ping >/dev/null 2>&1; }
if command -v mariadbd >/dev/null && ! mariadb_up; then
  echo "services: starting MariaDB"
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd
  for _ in $(seq 1 30); do mariadb_up && break; sleep 1; done
fi
pg_up || { echo "services: PostgreSQL is not answering on 127.0.0.1:5432" >&2; exit 1; }
redis_up || { echo "services: Redis is not answering on 127.0.0.1:6379" >&2; exit 1; }
if command -v mariadbd >/dev/null; then
  mariadb_up || { echo "services: MariaDB is not answering on 127.0.0.1:3306" >&2; exit 1; }
  echo "services: PostgreSQL, Redis and MariaDB are up"
else
  echo "services: PostgreSQL and Redis are up (no MariaDB here: the Slurm tests skip)"
fi
