#!/usr/bin/env bash
# Set up diagd on Debian 12 (idempotent), then start the daemon or run the test suite.
#
#   scripts/setup.sh start   system packages + Python venv, then start the daemon (systemd user
#                            service when a user manager runs, else a detached `diagd serve`)
#   scripts/setup.sh test    system packages + Python venv + the MCP conformance suite (npm, cached in
#                            ~/.cache/diagd), then the whole test suite
#   scripts/setup.sh         just the setup
#
# Run as root, or as a user with sudo (only apt-get and the tracefs mount need root).
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
action=${1:-setup}
venv=${DIAGD_VENV:-$top/.venv}
log() { printf '\033[1m[setup]\033[0m %s\n' "$*" >&2; }

if [ "$(id -u)" -eq 0 ]; then as_root() { "$@"; }
elif command -v sudo >/dev/null; then as_root() { sudo -n "$@" || sudo "$@"; }
else as_root() { log "need root for: $*"; return 1; }
fi

# Debian packages: the tools the back ends drive, plus what builds and tests them.
packages=(
  python3 python3-venv python3-dev gcc     # the Python environment (drgn builds from source if no wheel)
  tshark wireshark-common                  # tshark, sharkd, capinfos
  bpftrace                                 # bpftrace 0.17
  crash                                    # crash 8
  qemu-system-x86 busybox-static makedumpfile zstd binutils  # the vmcore fixture (tests/fixtures/make-vmcore.sh)
  socat                                    # serial tests: pseudo-terminal pairs
  systemd                                  # systemd-analyze verify for the unit
  openssh-client openssh-server            # `--ssh`, and the private sshd its tests start (never the system's)
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  log "installing: ${missing[*]}"
  # tshark asks whether non-root users may capture; answer "no" without a prompt.
  echo "wireshark-common wireshark-common/install-setuid boolean false" | as_root debconf-set-selections
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  log "system packages already installed"
fi

# bpftrace tracepoints need tracefs; a fresh machine of this kind does not mount it.
if [ ! -e /sys/kernel/tracing/available_events ] && [ ! -e /sys/kernel/debug/tracing/available_events ]; then
  log "mounting tracefs on /sys/kernel/tracing"
  as_root mount -t tracefs nodev /sys/kernel/tracing || log "could not mount tracefs: bpftrace tracepoints will be unavailable"
fi

# The real Mermaid parser (mermaid + jsdom under node) that tests/e2e/test_pcap_sequence.py runs on every
# diagram: cached outside the repository; without it those tests keep their grammar-level check only.
# Node.js comes from Debian only where none is installed: a NodeSource nodejs (this machine kind's) ships
# npm itself and conflicts with Debian's npm package.
mermaid_dir=${DIAGD_MERMAID_DIR:-$HOME/.cache/diagd/mermaid}
if [ ! -e "$mermaid_dir/node_modules/mermaid/package.json" ] || [ ! -e "$mermaid_dir/node_modules/jsdom/package.json" ]; then
  if ! command -v npm >/dev/null; then
    log "installing nodejs and npm (for the Mermaid parser)"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends nodejs npm \
      || log "could not install npm: the sequence-diagram tests will skip the real parser"
  fi
  log "installing the Mermaid parser into $mermaid_dir"
  mkdir -p "$mermaid_dir"
  npm install --prefix "$mermaid_dir" --no-audit --no-fund --silent mermaid@11.17.2 jsdom@29.1.1 \
    || log "could not install mermaid: the sequence-diagram tests will skip the real parser"
fi

# The Python environment: a venv in the checkout, diagd installed editable with test extras.
python=${PYTHON:-python3}
if [ ! -x "$venv/bin/python" ]; then
  log "creating $venv"
  "$python" -m venv "$venv"
fi
if ! "$venv/bin/python" -c "import diagd.daemon.cli, pytest_trio" 2>/dev/null \
   || [ "$top/pyproject.toml" -nt "$venv/.diagd-installed" ]; then
  log "installing diagd and its dependencies into $venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q -e "$top[test]"
  touch "$venv/.diagd-installed"
fi
mkdir -p "$HOME/.local/bin"
ln -sfn "$venv/bin/diagd" "$HOME/.local/bin/diagd"

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
    # The official MCP conformance suite (tests/e2e/test_conformance.py), with the Node it needs (>= 22,
    # from the npm registry like the suite: Debian's node 20 cannot run it), cached outside the repository.
    conformance_dir=${DIAGD_CONFORMANCE_DIR:-$HOME/.cache/diagd/conformance}
    if [ ! -e "$conformance_dir/node_modules/@modelcontextprotocol/conformance/package.json" ] \
       || ! grep -q '"version": "0.1.16"' "$conformance_dir/node_modules/@modelcontextprotocol/conformance/package.json" \
       || [ ! -x "$conformance_dir/node_modules/.bin/node" ]; then
      log "installing the MCP conformance suite into $conformance_dir"
      mkdir -p "$conformance_dir"
      npm install --prefix "$conformance_dir" --no-audit --no-fund --silent \
        @modelcontextprotocol/conformance@0.1.16 node@22.23.3 \
        || log "could not install the conformance suite: tests/e2e/test_conformance.py will skip"
    fi
    cd "$top"
    "$venv/bin/ruff" check .
    scripts/typecheck.sh
    scripts/lint-imports.sh
    exec "$venv/bin/python" -m pytest -q ;;
  *)
    echo "usage: $0 [setup|start|test]" >&2; exit 2 ;;
esac
