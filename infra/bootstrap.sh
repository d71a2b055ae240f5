#!/usr/bin/env bash
# Sets up a fresh machine for memoryd: Postgres binaries if missing, Java check, the project
# virtualenv from the hash-pinned lock file, the Kafka jars. Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${MEMORYD_VENV:-.venv}
UV_VERSION=0.13.9

if ! command -v initdb >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  echo "bootstrap: installing PostgreSQL server binaries"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi
if ! command -v java >/dev/null 2>&1 || ! command -v mvn >/dev/null 2>&1; then
  echo "bootstrap: installing Java 17 and Maven for the local Kafka broker"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless maven >/dev/null
fi
# The java the broker will run on (memoryd/dev/kafka.py: $JAVA_HOME's, else PATH's). Kafka 4
# needs 17+; an older one would only fail later, in the broker's log, with
# UnsupportedClassVersionError.
java_bin=$(command -v java || echo java)
if [ -n "${JAVA_HOME:-}" ] && [ -f "$JAVA_HOME/bin/java" ]; then java_bin=$JAVA_HOME/bin/java; fi
java_version=$("$java_bin" -version 2>&1 | awk -F'"' '/ version "/ {print $2; exit}' || true)
java_major=${java_version#1.}  # Java 8 and older call themselves 1.8, 1.7, ...
java_major=${java_major%%[!0-9]*}
if [ -z "$java_major" ] || [ "$java_major" -lt 17 ]; then
  echo "bootstrap: Kafka 4 needs Java 17 or newer, but $java_bin is Java ${java_version:-of an unknown version}" >&2
  echo "bootstrap: install one (apt-get install openjdk-17-jre-headless), then put it first on PATH or point JAVA_HOME at it" >&2
  exit 1
fi

stamp="$VENV/.lock-$(sha256sum requirements.lock pyproject.toml | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "bootstrap: creating $VENV from requirements.lock"
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q "uv==$UV_VERSION"
  "$VENV/bin/uv" pip install -q --python "$VENV/bin/python" --require-hashes -r requirements.lock
  "$VENV/bin/uv" pip install -q --python "$VENV/bin/python" --no-deps -e .
  rm -f "$VENV"/.lock-*
  touch "$stamp"
fi

# The Kafka jars, fetched now rather than by the first test session's broker fixture: a first
# download can outlast pytest's per-test timeout. Once cached, this only checks the cache.
"$VENV/bin/memoryd" dev fetch >/dev/null

# promtool checks and unit-tests the alert rules (tests/unit/test_alert_rules.py skips without
# it). Debian's `prometheus` package would install 37 packages (node exporter, smartmontools,
# ipmitool...) and a service; only its promtool is needed, a 48 MB binary that links nothing
# but libc, so it is taken out of the .deb (19 MB download) into the virtualenv.
if ! command -v promtool >/dev/null 2>&1 && [ ! -x "$VENV/bin/promtool" ]; then
  if command -v apt-get >/dev/null 2>&1; then
    echo "bootstrap: extracting promtool from Debian's prometheus package into $VENV/bin"
    deb_dir=$(mktemp -d)
    trap 'rm -rf "$deb_dir"' EXIT
    if ! (cd "$deb_dir" && apt-get download -qq -o APT::Sandbox::User=root prometheus) 2>/dev/null; then
      apt-get update -qq
      (cd "$deb_dir" && apt-get download -qq -o APT::Sandbox::User=root prometheus)
    fi
    dpkg-deb --fsys-tarfile "$deb_dir"/prometheus_*.deb | tar -x -C "$deb_dir" ./usr/bin/promtool
    install -m 0755 "$deb_dir/usr/bin/promtool" "$VENV/bin/promtool"
    "$VENV/bin/promtool" --version | head -1
  else
    echo "bootstrap: no apt-get; install promtool (Prometheus) to run the alert rule tests"
  fi
fi
