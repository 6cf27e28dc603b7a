# scripts/lib/deps.bash — the one install step of the build and the tests, sourced by
# scripts/cluster (what the build needs) and scripts/test (that, and what the tests need).
# Installs Debian packages only where missing; a test checks that both scripts use it.
#
#   deps_missing build|test   print the Debian packages missing for the build or the tests
#   deps_install build|test   install them (apt-get, as root or through sudo), then make
#                             sure cargo is on PATH

readonly DEPS_LIBFAKETIME=/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1
# The security-header scanner (scripts/check-headers), in a venv of its own: its
# dependencies would otherwise meet Schemathesis's.
readonly DEPS_SCANNER_VENV="${XDG_CACHE_HOME:-$HOME/.cache}/raftbox/drheader-venv"
readonly DEPS_SCANNER_REQUIREMENT="drheaderplus==3.0.4"

deps_have_libclang() {
    if [[ -n ${LIBCLANG_PATH:-} ]] && ls "$LIBCLANG_PATH"/libclang*.so* >/dev/null 2>&1; then
        return 0
    fi
    ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1
}

deps_missing() {
    local what=$1 missing=()
    [[ $what == build || $what == test ]] || {
        echo "deps_missing: build or test, not '$what'" >&2
        return 2
    }
    # The build: rocksdb's bindgen needs clang and libclang, rocksdb a C++ compiler;
    # scripts/cluster probes the nodes with curl.
    if ! command -v clang >/dev/null || ! deps_have_libclang; then
        missing+=(clang libclang-dev)
    fi
    command -v c++ >/dev/null || missing+=(g++)
    command -v curl >/dev/null || missing+=(curl)
    if [[ $what == test ]]; then
        # The clock-skew tests run nodes under libfaketime.
        [[ -e $DEPS_LIBFAKETIME ]] || missing+=(faketime)
        # The partition tests put nodes in network namespaces (ip) and cut links with nft.
        command -v ip >/dev/null || missing+=(iproute2)
        command -v nft >/dev/null || missing+=(nftables)
        # The sync case-folding test mounts a case-insensitive FUSE file system
        # (tests/data/ci_fuse.py) where the kernel has no ext4 casefold.
        command -v fusermount3 >/dev/null || missing+=(fuse3)
        # The web console's browser test drives headless Chromium through chromedriver.
        command -v chromium >/dev/null || missing+=(chromium)
        command -v chromedriver >/dev/null || missing+=(chromium-driver)
        # WebDAV is judged by outside clients: litmus, rclone, and davfs2 where FUSE is.
        command -v litmus >/dev/null || missing+=(litmus)
        command -v rclone >/dev/null || missing+=(rclone)
        command -v mount.davfs >/dev/null || missing+=(davfs2)
    fi
    if ((${#missing[@]} > 0)); then
        printf '%s\n' "${missing[@]}"
    fi
}

deps_as_root() {
    if [[ $(id -u) -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null; then
        sudo "$@"
    else
        echo "need root (or sudo) to run: $*" >&2
        return 1
    fi
}

deps_install() {
    local what=$1 missing
    missing="$(deps_missing "$what")" || return
    if [[ -n $missing ]]; then
        command -v apt-get >/dev/null || {
            echo "missing $(echo $missing) and no apt-get to install them" >&2
            return 1
        }
        echo "installing: $(echo $missing)" >&2
        deps_as_root env DEBIAN_FRONTEND=noninteractive apt-get update >&2
        # shellcheck disable=SC2086 # one package per word
        deps_as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
            $missing >&2
    else
        echo "the $what's system packages are present" >&2
    fi
    if [[ $what == test ]]; then
        # Python packages the tests run, pinned (module, then pip requirement): ci_fuse.py's
        # FUSE binding (a fusepy fork for libfuse 3; it overrides some of its methods), the
        # Standard Webhooks reference library that verifies webhook signatures, and
        # Schemathesis, which fuzzes the API against its OpenAPI description (scripts/fuzz-api).
        local module requirement
        while read -r module requirement; do
            python3 -c "import $module" 2>/dev/null && continue
            echo "installing: $requirement (pip)" >&2
            python3 -m pip install --quiet "$requirement" 2>/dev/null ||
                python3 -m pip install --quiet --break-system-packages "$requirement"
        done <<'PACKAGES'
mfusepy mfusepy==3.1.1
standardwebhooks standardwebhooks==1.1.0
schemathesis schemathesis==4.32.5
PACKAGES
        if ! "$DEPS_SCANNER_VENV/bin/drheader" --version 2>/dev/null | grep -q "${DEPS_SCANNER_REQUIREMENT#*==}"; then
            echo "installing: $DEPS_SCANNER_REQUIREMENT (pip, in $DEPS_SCANNER_VENV)" >&2
            rm -rf "$DEPS_SCANNER_VENV"
            python3 -m venv "$DEPS_SCANNER_VENV" &&
                "$DEPS_SCANNER_VENV/bin/python" -m pip install --quiet "$DEPS_SCANNER_REQUIREMENT" || {
                echo "could not install $DEPS_SCANNER_REQUIREMENT into $DEPS_SCANNER_VENV" >&2
                return 1
            }
        fi
    fi
    if ! command -v cargo >/dev/null; then
        if [[ -x $HOME/.cargo/bin/cargo ]]; then
            export PATH="$HOME/.cargo/bin:$PATH"
        else
            echo "cargo not found: install a Rust toolchain (https://rustup.rs) first" >&2
            return 1
        fi
    fi
}
