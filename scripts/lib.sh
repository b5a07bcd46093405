# shellcheck shell=bash
# Set-up shared by scripts/test.sh and scripts/quickstart.sh: source it.
#
# Installs only what is missing, so a second run on the same machine installs
# nothing and does not touch the network (Debian packages are checked with
# dpkg-query before apt-get runs; `apt-get update` runs only when something
# must be installed).

NIMBUS_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
NIMBUS_TARGET_DIR=${CARGO_TARGET_DIR:-$NIMBUS_ROOT/target}
NIMBUS_VENV=$NIMBUS_TARGET_DIR/test-venv

# Debian packages the Rust build needs (a C compiler and linker for the
# build scripts of dependencies; pkg-config for crates that probe for
# system libraries; protoc and protobuf's well-known types for the etcd
# client's gRPC code, generated at build time).
NIMBUS_BUILD_PACKAGES=(build-essential pkg-config protobuf-compiler libprotobuf-dev)

section() {
    if [ -t 1 ]; then
        printf '\n\033[1m==== %s ====\033[0m\n' "$*"
    else
        printf '\n==== %s ====\n' "$*"
    fi
}

info() {
    printf '  %s\n' "$*"
}

die() {
    printf 'error: %s\n' "$*" >&2
    exit 1
}

# Run a command as root: directly when root, else through sudo.
as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        die "need root or sudo to run: $*"
    fi
}

deb_installed() {
    [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]
}

_apt_updated=0

# apt_install PKG...: install the Debian packages that are not installed yet.
apt_install() {
    local missing=() pkg
    command -v dpkg-query >/dev/null 2>&1 || die "not a Debian system (no dpkg): install these by hand: $*"
    for pkg in "$@"; do
        deb_installed "$pkg" || missing+=("$pkg")
    done
    if [ "${#missing[@]}" -eq 0 ]; then
        info "Debian packages present: $*"
        return 0
    fi
    info "installing Debian packages: ${missing[*]}"
    if [ "$_apt_updated" -eq 0 ]; then
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
        _apt_updated=1
    fi
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# Make cargo available: from ~/.cargo if rustup put it there, else install
# Rust with rustup (only when cargo is missing).
ensure_rust() {
    if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then
        # shellcheck disable=SC1091
        . "$HOME/.cargo/env"
    fi
    if ! command -v cargo >/dev/null 2>&1; then
        info "cargo not found: installing Rust with rustup"
        apt_install curl ca-certificates
        curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs |
            sh -s -- -y --profile minimal --component clippy,rustfmt ||
            die "installing Rust with rustup failed; install Rust (1.80 or newer) by hand"
        # shellcheck disable=SC1091
        . "$HOME/.cargo/env"
    fi
    info "$(cargo --version)"
}

# cargo fmt and cargo clippy: add the rustup components when they are missing.
ensure_rust_lint_tools() {
    local want=()
    cargo fmt --version >/dev/null 2>&1 || want+=(rustfmt)
    cargo clippy --version >/dev/null 2>&1 || want+=(clippy)
    if [ "${#want[@]}" -gt 0 ]; then
        command -v rustup >/dev/null 2>&1 || die "cargo ${want[*]} missing and no rustup to add it"
        info "adding rustup components: ${want[*]}"
        rustup component add "${want[@]}"
    fi
}

ensure_build_deps() {
    apt_install "${NIMBUS_BUILD_PACKAGES[@]}"
    ensure_rust
}

# AWS-LC's FIPS module (cargo feature `fips`) is built with cmake and Go.
ensure_fips_build_deps() {
    apt_install cmake
    if ! command -v go >/dev/null 2>&1; then
        if [ -x /usr/local/go/bin/go ]; then
            export PATH="$PATH:/usr/local/go/bin"
        else
            apt_install golang-go
        fi
    fi
}

# A virtual environment with tests/requirements.txt, rebuilt only when the
# requirements or the Python interpreter change.
ensure_test_venv() {
    local req=$NIMBUS_ROOT/tests/requirements.txt python stamp want
    command -v python3 >/dev/null 2>&1 || apt_install python3
    python=$(command -v python3)
    if ! "$python" -c 'import venv, ensurepip' >/dev/null 2>&1; then
        # Debian's python3 has venv's pip bootstrap in a package of its own.
        apt_install python3-venv
    fi
    "$python" -c 'import sys; sys.exit(sys.version_info < (3, 9))' ||
        die "$python is older than Python 3.9"
    stamp=$NIMBUS_VENV/.nimbus-requirements
    want="$("$python" -c 'import sys; print(sys.executable, sys.version)') $(sha256sum "$req" | cut -d' ' -f1)"
    if [ -x "$NIMBUS_VENV/bin/python3" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        info "Python test packages present in ${NIMBUS_VENV#"$NIMBUS_ROOT"/}"
        return 0
    fi
    info "creating ${NIMBUS_VENV#"$NIMBUS_ROOT"/} with tests/requirements.txt"
    rm -rf "$NIMBUS_VENV"
    "$python" -m venv "$NIMBUS_VENV"
    "$NIMBUS_VENV/bin/python3" -m pip install --quiet --disable-pip-version-check -r "$req"
    printf '%s\n' "$want" >"$stamp"
}
