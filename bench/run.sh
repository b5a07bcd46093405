#!/usr/bin/env bash
# Nimbus against Samba on this machine, side by side (issue 4): installs what
# is missing (Samba's smbd, smbclient, smbtorture, Rust, the Python packages
# of tests/requirements.txt), builds nimbus in release mode, then runs
# bench/side_by_side.py, which prints a table and writes it to BENCHMARKS.md.
#
#   bash bench/run.sh                  the whole benchmark (about 10 minutes)
#   bash bench/run.sh --no-write       print only
#   bash bench/run.sh --help           the options of side_by_side.py
#
# Needs root, or sudo: smbd serves files as the logged-on user.
set -euo pipefail

# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
cd "$NIMBUS_ROOT"

section "Checking dependencies"
apt_install samba smbclient samba-testsuite
ensure_build_deps
ensure_test_venv

section "Building nimbus (release)"
cargo build --release -p nimbus

section "Nimbus against Samba"
as_root "$NIMBUS_VENV/bin/python3" bench/side_by_side.py \
    --nimbus "$NIMBUS_TARGET_DIR/release/nimbus" "$@"
