#!/usr/bin/env bash
# Set up diagd on Debian 12 (idempotent), then start the daemon or run the test suite.
#
#   scripts/setup.sh start   the runtime: Python venv with diagd, the back ends' tools (`diagd setup all`:
#                            tshark, bpftrace, crash), then start the daemon (systemd user service when
#                            a user manager runs, else a detached `diagd serve`)
#   scripts/setup.sh test    the runtime plus the test toolchain (QEMU, busybox, makedumpfile for the
#                            vmcore fixture; socat; OpenSSH; Node.js, Mermaid and the TypeScript MCP SDK;
#                            pytest, mypy, ruff; the MCP conformance suite and Inspector, cached in ~/.cache/diagd),
#                            then the whole test suite
#   scripts/setup.sh         just the runtime
#
# Run as root, or as a user with sudo (only apt-get and the tracefs mount need root). No package may
# start a service while it is installed, and an openssh-server installed here (the tests start their
# own private sshd) is left disabled: after this script, `ss -ltn` lists no port that was not there.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
action=${1:-setup}
venv=${DIAGD_VENV:-$top/.venv}
log() { printf '\033[1m[setup]\033[0m %s\n' "$*" >&2; }

if [ "$(id -u)" -eq 0 ]; then as_root() { "$@"; }
elif command -v sudo >/dev/null; then as_root() { sudo -n "$@" || sudo "$@"; }
else as_root() { log "need root for: $*"; return 1; }
fi

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

# apt-get install, with a policy-rc.d that refuses every service start (invoke-rc.d and
# deb-systemd-invoke both ask it) unless the machine has one of its own already.
policy=/usr/sbin/policy-rc.d
our_policy=
drop_policy() { if [ -n "$our_policy" ]; then as_root rm -f "$policy"; our_policy=; fi; }
trap drop_policy EXIT
apt_install() {
  local missing=() p
  for p in "$@"; do installed "$p" || missing+=("$p"); done
  if [ "${#missing[@]}" -eq 0 ]; then return 0; fi
  log "installing: ${missing[*]}"
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\n# scripts/setup.sh: no service starts while diagd installs packages\nexit 101\n' \
      | as_root tee "$policy" >/dev/null
    as_root chmod 755 "$policy"
    our_policy=1
  fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
  drop_policy
}

# -- the runtime --------------------------------------------------------------------------------------

# The Python environment (drgn builds from source where it has no wheel: gcc, python3-dev).
apt_install python3 python3-venv python3-dev gcc openssh-client  # openssh-client: `diagd ... --ssh HOST`

# The system's Python, the one apt installed above: a python3 found earlier on PATH may be a user's own
# (pyenv under /root), which the daemon's plain users cannot run, and not the Python Debian 12 ships.
python=${PYTHON:-/usr/bin/python3}
[ -x "$python" ] || python=python3
if [ ! -x "$venv/bin/python" ]; then
  log "creating $venv"
  "$python" -m venv "$venv"
fi
extras=""; probe="import diagd.daemon.cli.cli"
if [ "$action" = test ]; then extras="[test]"; probe="import diagd.daemon.cli.cli, pytest_trio"; fi
if ! "$venv/bin/python" -c "$probe" 2>/dev/null || [ "$top/pyproject.toml" -nt "$venv/.diagd-installed$extras" ]; then
  log "installing diagd$extras and its dependencies into $venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q -e "$top$extras"
  touch "$venv/.diagd-installed$extras"
fi
mkdir -p "$HOME/.local/bin"
ln -sfn "$venv/bin/diagd" "$HOME/.local/bin/diagd"

# What the back ends drive, as each declares it (tshark/sharkd, bpftrace, crash): one table, diagd's
# (`diagd setup` goes through sudo itself when not root; `diagd doctor` shows what is left).
"$venv/bin/diagd" setup all --yes

# bpftrace tracepoints need tracefs; a fresh machine of this kind does not mount it.
if [ ! -e /sys/kernel/tracing/available_events ] && [ ! -e /sys/kernel/debug/tracing/available_events ]; then
  log "mounting tracefs on /sys/kernel/tracing"
  as_root mount -t tracefs nodev /sys/kernel/tracing || log "could not mount tracefs: bpftrace tracepoints will be unavailable"
fi

# -- the test toolchain -------------------------------------------------------------------------------

if [ "$action" = test ]; then
  had_sshd=; installed openssh-server && had_sshd=1
  toolchain=(
    qemu-system-x86 busybox-static makedumpfile zstd binutils  # the vmcore fixture (tests/fixtures/make-vmcore.sh)
    socat                                                      # serial tests: pseudo-terminal pairs
    systemd                                                    # systemd-analyze verify for the units
    openssh-server                                             # the private sshd the --ssh tests start
    tcpreplay iproute2                                         # live capture tests: replay into a veth pair
    chromium                                                   # the views' browser tests (Playwright drives Debian's build)
  )
  apt_install "${toolchain[@]}"
  if [ -z "$had_sshd" ]; then
    # Installed for its binary only: the system's sshd stays off, now and after a reboot.
    log "openssh-server installed for the tests: disabling and masking the system's ssh service"
    if command -v systemctl >/dev/null; then
      as_root systemctl disable --now ssh.service ssh.socket 2>/dev/null || true
      as_root systemctl mask ssh.service ssh.socket 2>/dev/null || true
    fi
    as_root update-rc.d ssh disable 2>/dev/null || true
    log "(to use it: systemctl unmask ssh.service && systemctl enable --now ssh.service)"
  fi

  # The real Mermaid parser (tests/e2e/test_pcap_sequence.py) and the TypeScript MCP SDK
  # (tests/e2e/test_one_daemon.py), cached outside the repository; without them those tests skip.
  # Node.js comes from Debian only where none is installed: a NodeSource nodejs ships npm itself and
  # conflicts with Debian's npm package.
  if ! command -v npm >/dev/null; then
    apt_install nodejs npm || log "could not install npm: the tests that need Node.js will skip"
  fi
  node_cache() {  # DIR PACKAGE@VERSION...
    local dir=$1; shift
    local pkg ok=1
    for pkg in "$@"; do [ -e "$dir/node_modules/${pkg%@*}/package.json" ] || ok=; done
    if [ -z "$ok" ] && command -v npm >/dev/null; then
      log "installing $* into $dir"
      mkdir -p "$dir"
      npm install --prefix "$dir" --no-audit --no-fund --silent "$@" || log "could not install $*: those tests will skip"
    fi
  }
  node_cache "${DIAGD_MERMAID_DIR:-$HOME/.cache/diagd/mermaid}" mermaid@11.17.2 jsdom@29.1.1
  node_cache "$HOME/.cache/diagd/node-sdk" @modelcontextprotocol/sdk@1.32.2
fi

# The tools' MCP Apps views (docs/views.md): built with npm into ~/.cache/diagd/views/<hash>, then copied
# into daemon/views/dist, where the daemon reads them (the browser tests build them the same way).
# Without npm the tools are listed without their views (`diagd doctor` says so).
if command -v npm >/dev/null; then
  "$top/scripts/build-views.sh" --install >/dev/null || log "could not build the views: tools are listed without them"
else
  log "npm is not installed: the views are not built (diagd doctor)"
fi

case "$action" in
  setup)
    log "done: $HOME/.local/bin/diagd -> $venv/bin/diagd" ;;
  start)
    if systemctl --user show-environment >/dev/null 2>&1; then
      "$venv/bin/diagd" service install
    else
      log "no systemd user manager here: starting a detached daemon"
      "$venv/bin/diagd" start
    fi
    "$venv/bin/diagd" status ;;
  test)
    # The official MCP conformance suite (tests/e2e/test_conformance.py) and the MCP Inspector's
    # command-line clients (tests/e2e/test_inspector.py), each with the Node it needs (>= 22.19, from the
    # npm registry like them: Debian's node 20 cannot run them), cached outside the repository.
    npm_tool() {  # DIR PACKAGE VERSION TEST-FILE: install PACKAGE@VERSION and node@22 into DIR unless there
      local dir=$1 package=$2 version=$3 test=$4 manifest="$1/node_modules/$2/package.json"
      if [ ! -e "$manifest" ] || ! grep -q "\"version\": \"$version\"" "$manifest" \
         || [ ! -x "$dir/node_modules/.bin/node" ]; then
        log "installing $package into $dir"
        mkdir -p "$dir"
        npm install --prefix "$dir" --no-audit --no-fund --silent "$package@$version" node@22.23.3 \
          || log "could not install $package: $test will skip"
      fi
    }
    npm_tool "${DIAGD_CONFORMANCE_DIR:-$HOME/.cache/diagd/conformance}" @modelcontextprotocol/conformance 0.1.16 \
      tests/e2e/test_conformance.py
    npm_tool "${DIAGD_INSPECTOR_DIR:-$HOME/.cache/diagd/inspector}" @modelcontextprotocol/inspector 2.12.0 \
      tests/e2e/test_inspector.py
    cd "$top"
    # The test corpus (tests/corpus.toml) in its cache, every sha256 checked: copied from the folder
    # DIAGD_TEST_CAPTURES names (it holds pcaps/ and pcaps-extra/; by default ../shared beside this
    # checkout when there is one), else fetched from each file's pinned source. A capture missing there
    # makes its tests skip (fail under CI).
    captures=${DIAGD_TEST_CAPTURES:-}
    if [ -z "$captures" ] && [ -d "$top/../shared/pcaps" ]; then captures=$top/../shared; fi
    "$venv/bin/python" -m tests.support.corpus_cache fill ${captures:+--from "$captures"} \
      || log "some test captures could not be cached: the tests that need them will skip"
    "$venv/bin/ruff" check .
    scripts/typecheck.sh
    scripts/lint-imports.sh
    # Two workers (the machine has 2 cores; tests wait on tools and daemons): a module and its fixtures
    # stay on one worker (loadfile), so a module-scoped daemon is started once.
    exec "$venv/bin/python" -m pytest -q -n "${DIAGD_TEST_WORKERS:-2}" --dist loadfile ;;
  *)
    echo "usage: $0 [setup|start|test]" >&2; exit 2 ;;
esac
