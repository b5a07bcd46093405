#!/usr/bin/env bash
# Install what the tests need (when missing) and run every test: formatting,
# clippy, the Rust unit tests, a release build, then the integration tests in
# tests/ (the real nimbus binary driven by smbclient, smbtorture and Python
# smbprotocol on loopback). The one test command for developers and CI.
#
#   bash scripts/test.sh                  everything
#   bash scripts/test.sh --skip-install   don't check or install dependencies
#   bash scripts/test.sh --pytest-only    release build + integration tests only
#   bash scripts/test.sh -- ARGS          pass ARGS to pytest (e.g. -- -k smbclient)
#
# Runs as root, or as a user with sudo for the installs. Exits non-zero on
# the first failing step.
set -euo pipefail

# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

install=1
cargo_checks=1
pytest_args=()
while [ $# -gt 0 ]; do
    case $1 in
    --skip-install) install=0 ;;
    --pytest-only) cargo_checks=0 ;;
    --) shift; pytest_args=("$@"); break ;;
    -h | --help) sed -n '2,14p' "$0"; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
    esac
    shift
done

cd "$NIMBUS_ROOT"
started=$SECONDS
timings=()
step_start=$SECONDS
step_name=""

step() {
    if [ -n "$step_name" ]; then
        timings+=("$(printf '%5ds  %s' $((SECONDS - step_start)) "$step_name")")
    fi
    step_name=$1
    step_start=$SECONDS
    section "$1"
}

# shellcheck disable=SC2317  # run by the EXIT trap
summary() {
    local rc=$?
    if [ -n "$step_name" ]; then
        timings+=("$(printf '%5ds  %s' $((SECONDS - step_start)) "$step_name")")
    fi
    section "Summary"
    printf '%s\n' "${timings[@]}"
    if [ "$rc" -eq 0 ]; then
        printf 'all steps passed in %ds\n' $((SECONDS - started))
    else
        printf 'FAILED in step "%s" (exit status %d) after %ds\n' "$step_name" "$rc" $((SECONDS - started))
    fi
}
trap summary EXIT

if [ "$install" -eq 1 ]; then
    step "Installing test dependencies"
    # smbclient (with rpcclient) and smbtorture (samba-testsuite) are the real clients the
    # integration tests drive.
    apt_install smbclient samba-testsuite
    # smbtorture's multichannel and replay tests stop a channel with it
    # (torture:use_iptables).
    apt_install iptables
    # A real three-member etcd cluster (etcd-server, and etcdctl from
    # etcd-client) backs the cluster tests and the etcd store's own.
    apt_install etcd-server etcd-client
    # A real MIT KDC for the Kerberos logons: krb5kdc and kdb5_util
    # (krb5-kdc), kadmin.local (krb5-admin-server), kinit (krb5-user); the
    # server loads libgssapi_krb5.so.2 (libgssapi-krb5-2) at run time.
    apt_install krb5-kdc krb5-admin-server krb5-user libgssapi-krb5-2
    # smbprotocol's Kerberos logons need python-gssapi and krb5, built from
    # source against MIT krb5's headers.
    apt_install libkrb5-dev python3-dev
    # mkfs.xfs: block cloning is tested on an XFS file system with reflink,
    # loop-mounted by tests/test_server_side_copy.py.
    apt_install xfsprogs
    # promtool (prometheus) checks the metrics endpoint's scrapes.
    apt_install prometheus
    # systemd-analyze (systemd) verifies packaging/nimbus.service.
    apt_install systemd
    ensure_build_deps
    ensure_rust_lint_tools
    ensure_test_venv
else
    if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then
        # shellcheck disable=SC1091
        . "$HOME/.cargo/env"
    fi
    [ -x "$NIMBUS_VENV/bin/python3" ] || die "no $NIMBUS_VENV: run without --skip-install once"
fi

export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
if [ "${CI:-}" = "true" ]; then
    export CARGO_INCREMENTAL=0  # a fresh clone gains nothing from incremental builds
fi

if [ "$cargo_checks" -eq 1 ]; then
    step "cargo fmt --check"
    if [ -t 1 ]; then
        cargo fmt --all --check
    else
        cargo fmt --all --check -- --color=never
    fi

    # Files of a crate that import each other around a circle: only the
    # ones recorded in scripts/import_cycles.known, a list that only shrinks.
    step "import circles (scripts/import_cycles.py)"
    python3 scripts/import_cycles.py

    step "cargo clippy"
    cargo clippy --workspace --all-targets -- -D warnings

    # The layers below the handlers build on their own, with their tests:
    # the services and the cluster without server, connection or handler
    # code, the node without handlers, and none with a feature that only
    # the workspace's other crates switch on.
    step "cargo check of each layer alone"
    for layer in nimbus-transport nimbus-services nimbus-cluster nimbus-node; do
        cargo check -p "$layer" --all-targets
    done

    step "cargo test"
    cargo test --workspace
fi

step "cargo build --release"
cargo build --release
# bench/small_io.py's client, which tests/test_load_generator.py runs.
export NIMBUS_IO_LOAD_BIN=$NIMBUS_TARGET_DIR/release/nimbus-io-load
[ -x "$NIMBUS_IO_LOAD_BIN" ] || die "the release build made no $NIMBUS_IO_LOAD_BIN"
export NIMBUS_BIN=$NIMBUS_TARGET_DIR/release/nimbus
[ -x "$NIMBUS_BIN" ] || die "the release build made no $NIMBUS_BIN"

# The FIPS build (AWS-LC's FIPS module), in a target dir of its own so that
# the two binaries do not rebuild each other: tests/test_kerberos.py logs on
# to it with Kerberos and checks that it refuses NTLM and CCM.
step "cargo build --release --features fips (target/fips)"
if [ "$install" -eq 1 ]; then
    ensure_fips_build_deps
elif ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
    export PATH="$PATH:/usr/local/go/bin"
fi
CARGO_TARGET_DIR=$NIMBUS_TARGET_DIR/fips cargo build --release -p nimbus --features fips
export NIMBUS_FIPS_BIN=$NIMBUS_TARGET_DIR/fips/release/nimbus
[ -x "$NIMBUS_FIPS_BIN" ] || die "the FIPS build made no $NIMBUS_FIPS_BIN"

if [ "$cargo_checks" -eq 1 ]; then
    # The same vectors through the FIPS provider (AWS-LC's FIPS module),
    # built in the FIPS target dir, release profile, so that the module
    # the build above made is used again rather than built once more.
    step "cargo test -p nimbus-crypto --features fips (target/fips)"
    CARGO_TARGET_DIR=$NIMBUS_TARGET_DIR/fips cargo test --release -p nimbus-crypto --features fips
fi

# The Rust `smb` crate (smb-rs) as a client: tests/test_interop.py logs on
# with it. A crate of its own (interop/smb-rs, not in the workspace), built
# into target/interop.
step "cargo build (interop/smb-rs, target/interop)"
# A debug build: it compiles in about half the time of a release build,
# and the client only logs on and moves a few KiB.
CARGO_TARGET_DIR=$NIMBUS_TARGET_DIR/interop cargo build --manifest-path interop/smb-rs/Cargo.toml
export NIMBUS_SMBRS_BIN=$NIMBUS_TARGET_DIR/interop/debug/nimbus-smb-rs-check
[ -x "$NIMBUS_SMBRS_BIN" ] || die "the interop build made no $NIMBUS_SMBRS_BIN"

step "Integration tests (pytest tests/)"
# pytest writes to a file, and tail shows it as it grows: pytest's own
# output is then never a pipe, which a reader that stalls, closes, or is
# switched to non-blocking by some child process could fail under it
# (a failed write inside pytest ends the run with an internal error and
# no reasons). The file keeps the whole run for reading afterwards.
# A job in the background starts with SIGINT ignored; pytest gets it back
# (the wrapper below), so that an interrupt, passed on by the trap, ends
# the run through pytest's teardown, which stops the servers and etcd
# clusters it started.
pytest_log=$NIMBUS_TARGET_DIR/pytest.log
set +e
COLUMNS=200 "$NIMBUS_VENV/bin/python3" -c '
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
import pytest
sys.exit(pytest.main(sys.argv[1:]))
' -v --durations=30 tests/ ${pytest_args[@]+"${pytest_args[@]}"} >"$pytest_log" 2>&1 &
pytest_pid=$!
# tail in the background too: bash runs a trap only once the command in
# the foreground ends, and `wait` is the one that a signal interrupts.
tail -n +1 -f --pid="$pytest_pid" "$pytest_log" &
tail_pid=$!
trap 'kill -INT "$pytest_pid" 2>/dev/null; wait "$pytest_pid"; wait "$tail_pid"; exit 130' INT
trap 'kill -INT "$pytest_pid" 2>/dev/null; wait "$pytest_pid"; wait "$tail_pid"; exit 143' TERM
wait "$pytest_pid"
rc=$?
# tail sees pytest gone within a second and prints what is left first.
wait "$tail_pid"
trap - INT TERM
set -e
if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then
    # What failed and why, last, where a reader of a cut-short log looks,
    # with the machine's state that a run-wide failure would come from.
    echo
    echo "==== pytest exited $rc: its summary again (whole run: $pytest_log) ===="
    sed -n '/short test summary info/,$p' "$pytest_log" | cut -c1-400 | tail -n 80
    grep -n "INTERNALERROR\|^E  \|Error:" "$pytest_log" | cut -c1-300 | tail -n 20 || true
    echo "---- the machine now ----"
    df -h / /tmp "$NIMBUS_ROOT" 2>/dev/null || true
    free -m || true
    echo "processes: $(ps -e --no-headers | wc -l), threads: $(ps -eL --no-headers | wc -l)"
    ps -eo pid,nlwp,rss,etime,comm --sort=-rss | head -n 12 || true
fi
if [ "$rc" -eq 5 ]; then
    echo "pytest collected no test: that is a failure here" >&2
    exit 1
fi
exit "$rc"
