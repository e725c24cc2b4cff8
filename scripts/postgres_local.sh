#!/usr/bin/env bash
# A PostgreSQL server on this machine for tests/test_tune.py's PostgreSQL storage test (an
# Optuna study in a database), the way scripts/slurm_local.sh brings up SLURM for CI.
#
#   sudo bash scripts/postgres_local.sh     # prints the URL to export as LRA_TEST_POSTGRES_URL
#
# Debian/Ubuntu, as root: installs Debian's `postgresql` where missing, starts its cluster with
# pg_ctlcluster (no systemd needed), and creates the role and database `lra_tune` (password
# `lra_tune`, local TCP only). Running it again on a running server changes nothing and prints
# the same URL. Exits non-zero, with the reason, if the server does not come up.
set -u

fail() {
    echo "PostgreSQL is NOT up: $*" >&2
    exit 1
}

[ "$(id -u)" = 0 ] || fail "run it as root (sudo bash $0)"
if ! command -v pg_lsclusters >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null 2>&1 || true
    apt-get install -y -qq postgresql >/dev/null 2>&1 || fail "apt-get install postgresql failed"
fi
# The newest cluster Debian made at install time (e.g. "15 main").
read -r VERSION CLUSTER _ < <(pg_lsclusters --no-header | tail -n 1)
[ -n "${VERSION:-}" ] || fail "no cluster (pg_lsclusters lists none; pg_createcluster makes one)"
pg_ctlcluster "$VERSION" "$CLUSTER" start >/dev/null 2>&1 || true
PORT=$(pg_lsclusters --no-header | awk -v v="$VERSION" -v c="$CLUSTER" '$1 == v && $2 == c {print $3}')
for _ in $(seq 1 30); do
    su postgres -c "psql -p $PORT -tAc 'select 1'" >/dev/null 2>&1 && break
    sleep 1
done
su postgres -c "psql -p $PORT -tAc 'select 1'" >/dev/null 2>&1 \
    || fail "the server of cluster $VERSION/$CLUSTER does not answer (see /var/log/postgresql/)"
if [ "$(su postgres -c "psql -p $PORT -tAc \"select 1 from pg_roles where rolname='lra_tune'\"")" != 1 ]; then
    su postgres -c "psql -p $PORT -qc \"create role lra_tune login password 'lra_tune'\"" \
        || fail "cannot create the role lra_tune"
fi
if [ "$(su postgres -c "psql -p $PORT -tAc \"select 1 from pg_database where datname='lra_tune'\"")" != 1 ]; then
    su postgres -c "psql -p $PORT -qc 'create database lra_tune owner lra_tune'" \
        || fail "cannot create the database lra_tune"
fi
echo "postgresql://lra_tune:lra_tune@127.0.0.1:$PORT/lra_tune"
