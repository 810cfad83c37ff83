#!/usr/bin/env bash
# Install Debian's Chromium for the browser tests (Playwright's own browser download fails here).
# Run as root; idempotent.
set -euo pipefail
if [ ! -x /usr/bin/chromium ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >&2
fi
/usr/bin/chromium --version >&2
