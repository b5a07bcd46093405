#!/usr/bin/env bash
# Runs every cargo-fuzz target for SECONDS each (default 600), one after the
# other, starting from the committed seeds (fuzz/seeds/<target>) and the
# inputs of earlier runs (fuzz/corpus/<target>, not committed). Installs the
# nightly toolchain and cargo-fuzz when missing.
#
#   bash fuzz/run.sh [SECONDS] [TARGET...]
#
# A crash or timeout leaves its input in fuzz/artifacts/<target>/ and makes
# the script exit non-zero; copy the input to fuzz/regressions/<target>/,
# fix the bug, and `cargo test -p nimbus-server --test fuzz_inputs` replays
# it from then on.
set -euo pipefail

seconds=${1:-600}
shift || true
cd "$(dirname "${BASH_SOURCE[0]}")"

if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then
    # shellcheck disable=SC1091
    . "$HOME/.cargo/env"
fi
if ! rustup toolchain list | grep -q '^nightly'; then
    rustup toolchain install nightly --profile minimal
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(cargo +nightly fuzz list)
fi

cargo +nightly fuzz build -O

failed=()
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t" "seeds/$t" "regressions/$t" "artifacts/$t"
    # Streams of whole sessions need room; single messages do not.
    max_len=4096
    [ "$t" = connection ] && max_len=65536
    echo "=== $t: ${seconds}s"
    # New inputs go to the first directory; seeds and past findings (e.g. a
    # related compound naming another tree's FileId) only start the search.
    if ! cargo +nightly fuzz run -O "$t" "corpus/$t" "seeds/$t" "regressions/$t" -- \
        -max_total_time="$seconds" -max_len="$max_len" -rss_limit_mb=2048 \
        -timeout=10 -print_final_stats=1 2>&1 | tee "artifacts/$t/last-run.log" | grep -E '^(#[0-9]+ +DONE|==|SUMMARY|artifact_prefix|Test unit written|stat::)'; then
        :
    fi
    # One pattern at a time: ls of several fails when any one matches nothing.
    for kind in crash timeout oom; do
        if compgen -G "artifacts/$t/$kind-*" >/dev/null; then
            failed+=("$t")
            break
        fi
    done
done

if [ ${#failed[@]} -gt 0 ]; then
    echo "findings in: ${failed[*]} (see fuzz/artifacts/)" >&2
    exit 1
fi
echo "no findings in: ${targets[*]}"
