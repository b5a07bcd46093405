#!/usr/bin/env bash
# Build nimbus and start a working server in the foreground:
#   share "demo" (./demo/share) on 127.0.0.1:4450, user demo / demo-password.
# Installs the Rust toolchain and build dependencies first if they are missing
# (and smbclient, to connect with). Stop the server with Ctrl-C.
set -euo pipefail

# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$NIMBUS_ROOT"

section "Checking build dependencies"
ensure_build_deps
apt_install smbclient

section "Building nimbus (release)"
cargo build --release -p nimbus
nimbus=$NIMBUS_TARGET_DIR/release/nimbus

section "Preparing ./demo"
mkdir -p demo/share
if [ ! -e demo/share/README.txt ]; then
    cat >demo/share/README.txt <<'TEXT'
Hello from Nimbus.

This file lives in ./demo/share on the server, shared as "demo".
Put files here with smbclient's `put`, fetch them with `get`.
TEXT
fi
if "$nimbus" user list --db ./demo/users.db 2>/dev/null | grep -qw demo; then
    "$nimbus" user del demo --db ./demo/users.db
fi
printf '%s\n' demo-password | "$nimbus" user add demo --db ./demo/users.db --password-stdin
info "user demo (password demo-password) in ./demo/users.db"

section "Starting nimbus on 127.0.0.1:4450"
echo "Connect from another terminal with:"
echo
echo "  smbclient //127.0.0.1/demo -p 4450 -U demo%demo-password -m SMB3_11"
echo
echo "Stop the server with Ctrl-C."
echo
exec "$nimbus" serve --listen 127.0.0.1:4450 --share demo=./demo/share --user-db ./demo/users.db --state-dir ./demo/state
