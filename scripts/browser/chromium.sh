#!/usr/bin/env bash
# Headless Chromium for the browser tests of `probe view` (make test-browser, tests/test_view_browser.py).
#
#   scripts/browser/chromium.sh install   apt-get install Debian's chromium and chromium-driver where missing (root)
#   scripts/browser/chromium.sh check     say which chromium and chromedriver the tests will use
#
# The tests start Chromium themselves (headless, no sandbox, a fresh profile, no network services) and skip,
# saying why, where it cannot start; this script only puts the two programs on the machine.
set -euo pipefail

die() {
  echo "chromium.sh: $*" >&2
  exit 1
}

have() { command -v chromium >/dev/null && command -v chromedriver >/dev/null; }

cmd_install() {
  have && return 0
  [ "$(id -u)" -eq 0 ] || die "chromium and chromium-driver are not installed and installing them needs root (apt-get)"
  command -v apt-get >/dev/null || die "chromium and chromium-driver are not installed and there is no apt-get here"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends chromium chromium-driver >/dev/null 2>&1 ||
    { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends chromium chromium-driver >/dev/null; } ||
    die "apt-get install chromium chromium-driver failed"
  have || die "apt-get installed chromium, but chromium or chromedriver is still not on PATH"
}

cmd_check() {
  have || die "no chromium or chromedriver on PATH; run: scripts/browser/chromium.sh install (as root)"
  echo "chromium: $(command -v chromium) ($(chromium --version 2>/dev/null | head -n 1))"
  echo "chromedriver: $(command -v chromedriver) ($(chromedriver --version 2>/dev/null | head -n 1))"
}

case "${1:-}" in
  install) cmd_install ;;
  check) cmd_check ;;
  *) die "usage: $0 install|check" ;;
esac
