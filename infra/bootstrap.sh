#!/usr/bin/env bash
# Sets up a fresh machine for memoryd: Postgres binaries if missing, Java check, the project
# virtualenv from the hash-pinned lock file, the Kafka jars. Idempotent: a second run only checks.
# Debian packages are installed as root, or through sudo when run by another user.
set -euo pipefail

VENV=${MEMORYD_VENV:-.venv}
UV_VERSION=0.13.9

# Runs a command as root: directly when we are root, else through sudo.
as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    echo "bootstrap: '$*' needs root and sudo is not installed; run it as root, then again" >&2
    exit 1
  fi
}

apt_install() {
  as_root apt-get update -qq
  # Through env: sudo drops the caller's environment, DEBIAN_FRONTEND with it.
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# Debian's python3 comes without venv's ensurepip (python3-venv), so `python3 -m venv` fails.
ensure_python_venv() {
  if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
    echo "bootstrap: installing Python 3 with venv support"
    apt_install python3 python3-venv
  fi
}

main() {
  cd "$(dirname "$0")/.."

  if ! command -v initdb >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    echo "bootstrap: installing PostgreSQL server binaries"
    apt_install postgresql
  fi
  if ! command -v java >/dev/null 2>&1 || ! command -v mvn >/dev/null 2>&1; then
    echo "bootstrap: installing Java 17 and Maven for the local Kafka broker"
    apt_install openjdk-17-jre-headless maven
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
    ensure_python_venv
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
        as_root apt-get update -qq
        (cd "$deb_dir" && apt-get download -qq -o APT::Sandbox::User=root prometheus)
      fi
      dpkg-deb --fsys-tarfile "$deb_dir"/prometheus_*.deb | tar -x -C "$deb_dir" ./usr/bin/promtool
      install -m 0755 "$deb_dir/usr/bin/promtool" "$VENV/bin/promtool"
      "$VENV/bin/promtool" --version | head -1
    else
      echo "bootstrap: no apt-get; install promtool (Prometheus) to run the alert rule tests"
    fi
  fi
}

# Sourced (by its tests), it only defines the functions above.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  main "$@"
fi
