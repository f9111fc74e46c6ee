#!/usr/bin/env bash
# Install Debian's chromium and chromium-driver if they are missing: the browser test of the
# data-quality page (tests/dags/test_quality_page.py) drives them headless. No browser download.
set -euo pipefail
if ! command -v chromedriver >/dev/null 2>&1 || ! command -v chromium >/dev/null 2>&1; then
  echo "installing chromium and chromium-driver from Debian's packages" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends chromium chromium-driver >&2
fi
chromium --version >&2
