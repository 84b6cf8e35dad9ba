# Shell functions the scripts share (sourced, not run).

# The cache directory, chosen as quarry chooses it (config/paths.cc).
cache_dir() {
  if [[ -n ${QUARRY_CACHE_DIR:-} ]]; then
    echo "$QUARRY_CACHE_DIR"
  elif [[ $(id -u) -eq 0 ]]; then
    echo /var/cache/quarry
  else
    echo "${XDG_CACHE_HOME:-$HOME/.cache}/quarry"
  fi
}

# venv_path NAME REQUIREMENTS: where scripts/setup keeps the virtual environment of those pinned
# requirements: <cache>/NAME-<first 16 hex digits of their SHA-256>.
venv_path() {
  local hash
  hash=$(sha256sum "$2" | cut -c1-16)
  echo "$(cache_dir)/$1-$hash"
}

# use_ccache SOURCE_DIR: when ccache is there (scripts/setup installs it), sets `launcher` to the
# CMake arguments that compile through it and exports its settings: its cache lives in quarry's
# cache directory, outside the repository, keyed by each compilation's preprocessed input with
# paths taken relative to SOURCE_DIR, so a clean clone (CI, a second worktree, an older commit
# built for a benchmark) compiles only what changed. Without ccache, `launcher` is empty.
use_ccache() {
  launcher=()
  command -v ccache >/dev/null || return 0
  export CCACHE_DIR=${CCACHE_DIR:-$(cache_dir)/ccache} CCACHE_BASEDIR=$1 CCACHE_NOHASHDIR=1
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
}
