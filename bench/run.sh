#!/usr/bin/env bash
# Nimbus against Samba on this machine, side by side (issue 4): installs what
# is missing (Samba's smbd, smbclient, smbtorture, Rust, the Python packages
# of tests/requirements.txt), builds nimbus in release mode, then runs
# bench/side_by_side.py, which prints a table and writes it to BENCHMARKS.md.
#
#   bash bench/run.sh                  the whole benchmark (about 10 minutes)
#   bash bench/run.sh --no-write       print only
#   bash bench/run.sh --help           the options of side_by_side.py
#   bash bench/run.sh --cluster [...]  a three-node cluster against one node
#                                      and Samba (bench/cluster_contention.py,
#                                      about 8 minutes; its --help for options)
#   bash bench/run.sh --small-io [...] small random reads and writes at
#                                      queue depth (bench/small_io.py, about
#                                      6 minutes; its --help for options)
#   bash bench/run.sh --many-clients [...]  16 to 1,000 connections, each
#                                      its own session, opening and reading
#                                      (bench/many_clients.py, about 4
#                                      minutes; its --help for options)
#   bash bench/run.sh --control-plane [...]  what 3, 16 and 64 cluster nodes
#                                      ask of etcd idle and under two light
#                                      loads, join, leave, reclaim and
#                                      persistent reclaim
#                                      (bench/control_plane.py, about 16
#                                      minutes; its --help for options)
#
# Needs root, or sudo: smbd serves files as the logged-on user.
set -euo pipefail

# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
cd "$NIMBUS_ROOT"

cluster=0
control_plane=0
load_script=""
if [ "${1:-}" = "--cluster" ]; then
    cluster=1
    shift
elif [ "${1:-}" = "--control-plane" ]; then
    cluster=1
    control_plane=1
    shift
elif [ "${1:-}" = "--small-io" ]; then
    load_script=bench/small_io.py
    shift
elif [ "${1:-}" = "--many-clients" ]; then
    load_script=bench/many_clients.py
    shift
fi

section "Checking dependencies"
apt_install samba smbclient samba-testsuite
if [ "$cluster" = 1 ]; then
    apt_install etcd-server etcd-client
fi
ensure_build_deps
ensure_test_venv

section "Building nimbus (release)"
cargo build --release -p nimbus

if [ -n "$load_script" ]; then
    section "Building the load generator (crates/nimbus-load, release)"
    cargo build --release -p nimbus-load
    section "Nimbus against Samba: $load_script"
    as_root "$NIMBUS_VENV/bin/python3" "$load_script" \
        --nimbus "$NIMBUS_TARGET_DIR/release/nimbus" \
        --load "$NIMBUS_TARGET_DIR/release/nimbus-io-load" "$@"
    exit 0
fi

if [ "$control_plane" = 1 ]; then
    section "The cluster's control plane at 3, 16 and 64 nodes"
    as_root "$NIMBUS_VENV/bin/python3" bench/control_plane.py \
        --nimbus "$NIMBUS_TARGET_DIR/release/nimbus" "$@"
    exit 0
fi

if [ "$cluster" = 1 ]; then
    section "A three-node cluster against one node and Samba"
    as_root "$NIMBUS_VENV/bin/python3" bench/cluster_contention.py \
        --nimbus "$NIMBUS_TARGET_DIR/release/nimbus" "$@"
    exit 0
fi

section "Nimbus against Samba"
as_root "$NIMBUS_VENV/bin/python3" bench/side_by_side.py \
    --nimbus "$NIMBUS_TARGET_DIR/release/nimbus" "$@"
