#!/usr/bin/env bash
# PostgreSQL for the memory tests.
#
#   bash .ci/postgres.sh --install-only   install Debian's postgresql if initdb is missing; nothing else.
#                                         (the pytest fixture then starts its own throwaway server)
#   eval "$(bash .ci/postgres.sh)"        also start a throwaway server on 127.0.0.1 and a free port,
#                                         and export MAXKERNEL_TEST_PG_URL (the tests then use it)
#   bash .ci/postgres.sh --stop DIR       stop the server started in DIR (printed as MAXKERNEL_TEST_PG_DIR)
#
# initdb refuses to run as root, so as root the cluster belongs to the `postgres` user.
# Everything but the export lines goes to stderr.
set -euo pipefail

find_bin() {
  local dir
  for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    if [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ]; then echo "$dir"; return 0; fi
  done
  if command -v initdb >/dev/null 2>&1; then dirname "$(readlink -f "$(command -v initdb)")"; return 0; fi
  return 1
}

as_owner() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

if [ "${1:-}" = "--stop" ]; then
  dir="${2:?usage: postgres.sh --stop DIR}"
  bin="$(find_bin)"
  as_owner "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >&2
  rm -rf "$dir"
  exit 0
fi

if ! bin="$(find_bin)"; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "postgres.sh: no PostgreSQL binaries (initdb) and not root: install the postgresql package" >&2
    exit 1
  fi
  echo "postgres.sh: installing postgresql" >&2
  apt-get update >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql >&2
  bin="$(find_bin)"
fi

if [ "${1:-}" = "--install-only" ]; then
  echo "postgres.sh: PostgreSQL binaries in $bin" >&2
  exit 0
fi

dir="$(mktemp -d /tmp/maxkernel-pg-XXXXXX)"
chmod 755 "$dir"
if [ "$(id -u)" -eq 0 ]; then chown postgres:postgres "$dir"; fi
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"

as_owner "$bin/initdb" -D "$dir/data" -U postgres --auth=trust --encoding=UTF8 --no-sync >&2
as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
  -o "-c listen_addresses=127.0.0.1 -p $port -c unix_socket_directories=$dir -c fsync=off" start >&2
as_owner "$bin/createdb" -h 127.0.0.1 -p "$port" -U postgres maxkernel_test >&2

echo "export MAXKERNEL_TEST_PG_URL=postgresql+psycopg://postgres@127.0.0.1:$port/maxkernel_test"
echo "export MAXKERNEL_TEST_PG_DIR=$dir"
